//go:build race

package sim

func init() { defaultSeeds = 60 }
