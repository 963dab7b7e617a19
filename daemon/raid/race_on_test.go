//go:build race

package raid

// raceBuild: built with -race, whose sync.Pool drops a random share of
// the items put back (to find misuse), so allocation counts are not the
// program's.
const raceBuild = true
