package validate

import "testing"

// TestFmtBytesIsTheUnitsFormatter: validate's messages write sizes with
// the one byte formatter (internal/units), so a 512 KiB short-run region
// reads "512.0 KiB" (the package's own copy wrote "524288 B") and a 2 TiB
// fill "2.00 TiB" (not "2048.00 GiB").
func TestFmtBytesIsTheUnitsFormatter(t *testing.T) {
	for n, want := range map[int64]string{512 << 10: "512.0 KiB", 2 << 40: "2.00 TiB", 3 << 29: "1.50 GiB", 100: "100 B"} {
		if got := fmtBytes(n); got != want {
			t.Errorf("fmtBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
