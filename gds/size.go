package gds

import (
	"fmt"

	"tier0/internal/units"
)

// ParseSize parses a byte count: a plain number, or one with a binary
// suffix K, M, G, T (also KiB, MiB..., case-insensitive), as gdsio takes
// them. "1M" is 1048576.
func ParseSize(s string) (int64, error) {
	n, err := units.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return n, nil
}
