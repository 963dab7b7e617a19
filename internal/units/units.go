package units

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseBytes parses "4096", "4K", "64KiB", "1g", "8 MiB" into bytes.
func ParseBytes(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	num, unit := t, ""
	if i := strings.IndexFunc(t, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	shift := -1
	switch unit {
	case "", "B":
		shift = 0
	case "K", "KB", "KIB":
		shift = 10
	case "M", "MB", "MIB":
		shift = 20
	case "G", "GB", "GIB":
		shift = 30
	case "T", "TB", "TIB":
		shift = 40
	}
	if num == "" || shift < 0 {
		return 0, fmt.Errorf("size %q: expected a byte count or a number with K, M, G or T (KiB, MiB, GiB, TiB; binary units), like 4096, 64KiB or 1G", s)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %v", s, err)
	}
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("size %q is too large: at most 4 EiB", s)
	}
	return n << shift, nil
}

// FormatBytes writes n for a person to read: "512 B", "64.0 MiB",
// "1.50 GiB", "2.00 TiB".
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<40 || n <= -1<<40:
		return fmt.Sprintf("%.2f TiB", float64(n)/(1<<40))
	case n >= 1<<30 || n <= -1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20 || n <= -1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10 || n <= -1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
