package sim

import (
	"strings"
	"testing"

	"tier0/reliability/history"
)

// A run counts in the row of each of its kinds and of each pair of kinds
// whose faults overlap in time; faults that follow each other make no
// overlap row, and a failed run counts as failed in every row it is in.
func TestTallyCountsKindsAndOverlaps(t *testing.T) {
	var ty Tally
	ok := history.Result{Linearizable: true}
	ty.Add(Result{History: ok, Ops: 10, Schedule: Schedule{{Kind: Kill, Node: "C", Start: 5, Len: 12}, {Kind: Freeze, Node: "A", Start: 16, Len: 30}}})
	ty.Add(Result{History: ok, Ops: 7, Schedule: Schedule{{Kind: Freeze, Node: "A", Start: 0, Len: 5}, {Kind: Kill, Node: "B", Start: 5, Len: 3}}, Unserved: true})
	ty.Add(Result{History: ok, Ops: 4, Schedule: Schedule{{Kind: LinkCut, Node: "D", Start: 1, Len: 2}, {Kind: LinkCut, Node: "E", Start: 2, Len: 2}}})
	for key, want := range map[string]TallyRow{
		Kill:                    {Runs: 2, Ops: 17, Failed: 1},
		Freeze:                  {Runs: 2, Ops: 17, Failed: 1},
		Freeze + "+" + Kill:     {Runs: 1, Ops: 10},
		LinkCut:                 {Runs: 1, Ops: 4},
		LinkCut + "+" + LinkCut: {Runs: 1, Ops: 4},
		Kill + "+" + Freeze:     {},
		DriveFail:               {},
	} {
		if got := ty.Row(key); got != want {
			t.Errorf("row %q: %+v, want %+v", key, got, want)
		}
	}
	md := ty.Markdown()
	if i, j := strings.Index(md, "| "+Kill+" |"), strings.Index(md, "| "+Freeze+"+"+Kill+" |"); i < 0 || j < i {
		t.Errorf("table lists kinds before overlaps:\n%s", md)
	}
}
