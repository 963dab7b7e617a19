//go:build race

package cluster

// raceEnabled: the race detector slows the randomized test ~20x; it runs
// fewer seeds then.
const raceEnabled = true
