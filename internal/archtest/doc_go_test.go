package archtest

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageCommentInDocGo: every package's comment is in its doc.go, so
// that a reader finds it in one place and no grab-bag file carries it
// (issue 14). A package of test files only keeps its comment in a test.
func TestPackageCommentInDocGo(t *testing.T) {
	for _, p := range listPackages(t) {
		dir := filepath.Join("../..", p.path)
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		fs := token.NewFileSet()
		var others []string
		hasDoc := false
		for _, e := range ents {
			n := e.Name()
			if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fs, filepath.Join(dir, n), nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Errorf("%s/%s: %v", p.path, n, err)
				continue
			}
			if f.Doc == nil {
				continue
			}
			if n == "doc.go" {
				hasDoc = true
			} else {
				others = append(others, n)
			}
		}
		if len(others) > 0 {
			t.Errorf("%s: %s carries a package comment; move it to %s/doc.go (one package comment per package, in doc.go)", p.path, strings.Join(others, ", "), p.path)
		} else if !hasDoc && hasNonTestGo(ents) {
			t.Errorf("%s: no package comment in %s/doc.go; write one there (what the package is for, how it is used)", p.path, p.path)
		}
	}
}

func hasNonTestGo(ents []os.DirEntry) bool {
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			return true
		}
	}
	return false
}
