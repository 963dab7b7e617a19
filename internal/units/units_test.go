package units

import (
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"4096": 4096, "0": 0, "64MiB": 64 << 20, "1G": 1 << 30, "2TiB": 2 << 40, "8 KiB": 8192,
		"1M": 1 << 20, "10g": 10 << 30, "4k": 4096, "512KB": 512 << 10, " 7B ": 7,
	} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "M", "12XB", "-1", "1.5G", "x", "99999999999T", "1 K B"} {
		if n, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, n)
		} else if !strings.Contains(err.Error(), "size") {
			t.Errorf("ParseBytes(%q): error %q does not name the size", in, err)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{512: "512 B", 4096: "4.0 KiB", 64 << 20: "64.0 MiB", 3 << 29: "1.50 GiB", 2 << 40: "2.00 TiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"64MiB", "1G", "4096", "8 KiB", "99999999999T", "4k"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseBytes(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseBytes(%q) = %d", s, n)
		}
	})
}
