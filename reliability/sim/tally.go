package sim

import (
	"fmt"
	"slices"
	"strings"
)

// Tally counts seeds by fault kind and by overlapping pair of kinds: for
// each, the runs whose schedule has it, the operations those runs checked
// and how many of them failed (a run counts in every row its schedule
// has). It is the soak's table in docs/RELIABILITY.md.
type Tally struct {
	rows map[string]*TallyRow
}

// TallyRow is one kind's or one overlap's counts.
type TallyRow struct {
	Runs, Ops, Failed int
}

// Add counts r in every row its schedule has.
func (t *Tally) Add(r Result) {
	if t.rows == nil {
		t.rows = map[string]*TallyRow{}
	}
	for _, k := range r.Schedule.rows() {
		row := t.rows[k]
		if row == nil {
			row = &TallyRow{}
			t.rows[k] = row
		}
		row.Runs++
		row.Ops += r.Ops
		if !r.OK() {
			row.Failed++
		}
	}
}

// Row returns the counts of a kind ("freeze") or of an overlap of two
// kinds ("freeze+kill", the kinds in order).
func (t *Tally) Row(key string) TallyRow {
	if r := t.rows[key]; r != nil {
		return *r
	}
	return TallyRow{}
}

// Markdown is the table: kinds first, then overlaps, each alphabetical.
func (t *Tally) Markdown() string {
	keys := make([]string, 0, len(t.rows))
	for k := range t.rows {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if pa, pb := strings.Contains(a, "+"), strings.Contains(b, "+"); pa != pb {
			if pa {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	var b strings.Builder
	b.WriteString("| kind / overlap | runs | ops | failed |\n|---|---|---|---|\n")
	for _, k := range keys {
		r := t.rows[k]
		fmt.Fprintf(&b, "| %s | %d | %d | %d |\n", k, r.Runs, r.Ops, r.Failed)
	}
	return b.String()
}

// rows are the schedule's kinds and the pairs of kinds of its faults
// whose windows overlap in time, each once.
func (s Schedule) rows() []string {
	var out []string
	add := func(k string) {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	for i, f := range s {
		add(f.Kind)
		for _, g := range s[i+1:] {
			if f.Start < g.Start+g.Len && g.Start < f.Start+f.Len {
				a, b := f.Kind, g.Kind
				if b < a {
					a, b = b, a
				}
				add(a + "+" + b)
			}
		}
	}
	return out
}
