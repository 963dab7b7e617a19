package archtest

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxFileLines bounds every Go file under daemon/, test files included
// (issue 14: files that each do one thing).
const maxFileLines = 600

// maxFuncLines bounds every function of the data path's non-test files,
// from its `func` line to its closing brace.
const maxFuncLines = 120

// dataPath are the folders whose functions maxFuncLines bounds: the RAID
// engine, the target, the host and the block devices.
var dataPath = []string{"daemon/raid", "daemon/target", "daemon/host", "daemon/blockdev"}

// longFiles and longFuncs are the exceptions, each with its reason
// (docs/ARCHITECTURE.md, "Size limits"). Keys: "daemon/x/file.go", and
// "daemon/x/file.go:Func" or "daemon/x/file.go:Type.Method". Empty today:
// a new entry needs a reason a reviewer accepts.
var (
	longFiles = map[string]string{}
	longFuncs = map[string]string{}
)

// root is the module's root, from this package's folder.
const root = "../.."

// goFiles lists the .go files under dir (relative to top, as the result),
// with or without the tests.
func goFiles(t *testing.T, top, dir string, tests bool) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(top, dir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || (!tests && strings.HasSuffix(p, "_test.go")) {
			return nil
		}
		rel, _ := filepath.Rel(top, p)
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// TestDaemonFilesShort: no Go file under daemon/ is over maxFileLines
// lines unless longFiles gives the reason.
func TestDaemonFilesShort(t *testing.T) {
	for _, f := range goFiles(t, root, "daemon", true) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		n := bytes.Count(b, []byte("\n"))
		if _, ok := longFiles[f]; n > maxFileLines && !ok {
			t.Errorf("%s has %d lines, more than %d: split it along its seams (as issue 14 did for target_test.go), or add it to longFiles in internal/archtest/size_test.go with the reason", f, n, maxFileLines)
		}
	}
}

// TestDataPathFunctionsShort: no function of the data path's non-test
// files is over maxFuncLines lines unless longFuncs gives the reason.
func TestDataPathFunctionsShort(t *testing.T) {
	for _, fn := range longFunctions(t, root, dataPath) {
		if _, ok := longFuncs[fn.key]; !ok {
			t.Errorf("%s: %s has %d lines, more than %d: cut it into steps (as issue 14 did for raid's writeSpanLocked), or add %q to longFuncs in internal/archtest/size_test.go with the reason", fn.pos, fn.name, fn.lines, maxFuncLines, fn.key)
		}
	}
}

// TestSizeAllowListsCurrent: every exception still names a file or a
// function over its limit, so that the lists only shrink.
func TestSizeAllowListsCurrent(t *testing.T) {
	long := map[string]bool{}
	for _, fn := range longFunctions(t, root, dataPath) {
		long[fn.key] = true
	}
	for k := range longFuncs {
		if !long[k] {
			t.Errorf("longFuncs names %s, which is not over %d lines (or gone): remove it", k, maxFuncLines)
		}
	}
	for f := range longFiles {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil || bytes.Count(b, []byte("\n")) <= maxFileLines {
			t.Errorf("longFiles names %s, which is not over %d lines (or gone: %v): remove it", f, maxFileLines, err)
		}
	}
}

type longFunc struct {
	key, name, pos string
	lines          int
}

// longFunctions lists the functions and methods of the non-test files
// under dirs (relative to top) over maxFuncLines lines.
func longFunctions(t *testing.T, top string, dirs []string) []longFunc {
	t.Helper()
	var out []longFunc
	fset := token.NewFileSet()
	for _, dir := range dirs {
		for _, f := range goFiles(t, top, dir, false) {
			file, err := parser.ParseFile(fset, filepath.Join(top, f), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
				if n := end.Line - start.Line + 1; n > maxFuncLines {
					name := funcName(fd)
					out = append(out, longFunc{key: f + ":" + name, name: name, pos: fmt.Sprintf("%s:%d", f, start.Line), lines: n})
				}
			}
		}
	}
	return out
}

// funcName is Func, or Type.Method for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// TestLongFunctionsFound checks the finder itself on files written for
// it, so that the size test cannot pass by finding nothing: a method one
// line over the limit is found (as Type.Method), one at the limit, a short
// function and a test file's long function are not.
func TestLongFunctionsFound(t *testing.T) {
	dir := t.TempDir()
	fn := func(name string, lines int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "func %s {\n", name)
		for range lines - 2 {
			b.WriteString("\t_ = 1\n")
		}
		b.WriteString("}\n\n")
		return b.String()
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("p.go", "package p\n\ntype T[K any] struct{}\n\n"+fn("(t *T[K]) Over()", maxFuncLines+1)+fn("AtLimit()", maxFuncLines)+fn("Short()", 2))
	write("p_test.go", "package p\n\n"+fn("TestLong()", 3*maxFuncLines))
	var got []string
	for _, f := range longFunctions(t, dir, []string{"."}) {
		got = append(got, fmt.Sprintf("%s %d", f.key, f.lines))
	}
	if want := fmt.Sprintf("p.go:T.Over %d", maxFuncLines+1); strings.Join(got, "; ") != want {
		t.Errorf("long functions found: %q, want only %q", got, want)
	}
}
