//go:build !race

package raid

const raceBuild = false
