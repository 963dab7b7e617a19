package archtest

import (
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// docRow is one row of docs/ARCHITECTURE.md's package table: the packages
// it names and the tier0 packages it says they import.
type docRow struct {
	line     int
	pkgs     []string // as written, without backticks
	imports  string   // the third column as written
	anything bool     // "anything (today: ...)": the list is what it imports today
	daemon   bool     // "every daemon/... package"
}

var backticked = regexp.MustCompile("`([^`]+)`")

func docTable(t *testing.T) []docRow {
	t.Helper()
	b, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatalf("reading the package table: %v", err)
	}
	var rows []docRow
	in := false
	for i, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "| package |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(l, "|---") {
			continue
		}
		if !strings.HasPrefix(l, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), " | ")
		if len(cells) != 3 {
			t.Fatalf("docs/ARCHITECTURE.md:%d: %d cells, expected 3 (package | what it is | imports); a '|' inside a cell breaks the table", i+1, len(cells))
		}
		r := docRow{line: i + 1, imports: strings.TrimSpace(cells[2])}
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			r.pkgs = append(r.pkgs, m[1])
		}
		r.anything = strings.HasPrefix(r.imports, "anything")
		r.daemon = strings.HasPrefix(r.imports, "every `daemon/...` package")
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatal("docs/ARCHITECTURE.md has no package table (a header row starting \"| package |\")")
	}
	return rows
}

// stripParens removes every parenthesized remark, nested ones included.
func stripParens(s string) string {
	var b strings.Builder
	depth := 0
	for _, c := range s {
		switch {
		case c == '(':
			depth++
		case c == ')' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// docImports is the set of package names a row's third column lists.
func (r docRow) docImports() []string {
	s := r.imports
	if r.anything {
		_, s, _ = strings.Cut(s, "today:")
		s = strings.TrimSuffix(strings.TrimSpace(s), ")")
	} else {
		s = stripParens(s)
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.Trim(strings.TrimSpace(f), "`")
		if f == "" || f == "—" {
			continue
		}
		out = append(out, f)
	}
	return out
}

// resolve maps a name as the table writes it (a path, or its last
// elements, daemon/ first: "cluster" is daemon/cluster, not test/cluster)
// onto the one package it names.
func resolve(name string, all []string) (string, bool) {
	for _, p := range []string{name, "daemon/" + name} {
		if slices.Contains(all, p) {
			return p, true
		}
	}
	var hits []string
	for _, p := range all {
		if strings.HasSuffix(p, "/"+name) {
			hits = append(hits, p)
		}
	}
	if len(hits) != 1 {
		return "", false
	}
	return hits[0], true
}

// TestDocTableMatchesImports keeps docs/ARCHITECTURE.md's package table
// true: every package is in it, and each row's third column lists exactly
// the tier0 packages its packages' non-test files import (go list).
func TestDocTableMatchesImports(t *testing.T) {
	pkgs := listPackages(t)
	var all []string
	imports := map[string][]string{}
	for _, p := range pkgs {
		all = append(all, p.path)
		imports[p.path] = p.imports
	}
	covered := map[string]bool{}
	for _, r := range docTable(t) {
		var members []string
		for _, name := range r.pkgs {
			if dir, ok := strings.CutSuffix(name, "/..."); ok {
				// A folder row: its packages are covered, their imports
				// are checked by TestImportRules alone.
				for _, p := range all {
					if strings.HasPrefix(p, dir+"/") {
						covered[p] = true
					}
				}
				continue
			}
			if !slices.Contains(all, name) {
				t.Errorf("docs/ARCHITECTURE.md:%d: package %s does not exist (go list tier0/...); remove or rename its row", r.line, name)
				continue
			}
			covered[name] = true
			members = append(members, name)
		}
		if len(members) == 0 || len(members) != len(r.pkgs) {
			continue
		}
		got := map[string]bool{}
		for _, m := range members {
			for _, imp := range imports[m] {
				got[imp] = true
			}
		}
		if r.daemon {
			for imp := range got {
				if !strings.HasPrefix(imp, "daemon/") {
					t.Errorf("docs/ARCHITECTURE.md:%d: %s imports %s, but the table says it imports only daemon/ packages", r.line, strings.Join(members, ", "), imp)
				}
			}
			continue
		}
		want := map[string]bool{}
		for _, name := range r.docImports() {
			p, ok := resolve(name, all)
			if !ok {
				t.Errorf("docs/ARCHITECTURE.md:%d: %q in the imports column names no single package; write its path (e.g. daemon/blockdev)", r.line, name)
				continue
			}
			want[p] = true
		}
		var missing, extra []string
		for p := range got {
			if !want[p] {
				missing = append(missing, p)
			}
		}
		for p := range want {
			if !got[p] {
				extra = append(extra, p)
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		if len(missing) > 0 {
			t.Errorf("docs/ARCHITECTURE.md:%d: %s imports %s, which its row does not list; add them to the third column", r.line, strings.Join(members, ", "), strings.Join(missing, ", "))
		}
		if len(extra) > 0 {
			t.Errorf("docs/ARCHITECTURE.md:%d: the row of %s lists %s, which it does not import; remove them from the third column", r.line, strings.Join(members, ", "), strings.Join(extra, ", "))
		}
	}
	for _, p := range all {
		if !covered[p] {
			t.Errorf("package %s has no row in docs/ARCHITECTURE.md's package table; add one (what it is, what it imports)", p)
		}
	}
}
