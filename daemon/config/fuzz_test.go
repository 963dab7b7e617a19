package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse checks that no input makes the loader panic, and that an
// accepted configuration always has fully placed arrays.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("../../site-configs/*.yaml")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(baseNodes + `arrays: [{name: A, level: raid5, home: A, members: auto, width: 3}]`))
	f.Add([]byte(baseNodes + `arrays: [{name: A, level: raid6, home: B, members: [A1, C1, D1]}]`))
	f.Add([]byte("cluster: x\nnodes: 7\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			return
		}
		for _, a := range c.Arrays {
			if len(a.Members) != a.Width {
				t.Fatalf("accepted array %s with %d members, width %d", a.Name, len(a.Members), a.Width)
			}
		}
	})
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"64MiB", "1G", "4096", "8 KiB", "99999999999T"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}
