package gds

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize parses a byte count: a plain number, or one with a binary
// suffix K, M, G, T (also KiB, MiB..., case-insensitive), as gdsio takes
// them. "1M" is 1048576.
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("%w: size %q, expected a byte count like 4096, 1M or 10G", ErrUsage, s)
	}
	return v * mult, nil
}
