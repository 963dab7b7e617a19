package raid

import (
	"fmt"
	"math/rand"
	"testing"

	"tier0/daemon/blockdev"
)

// An array that has lost its last redundancy (RAID-5 with one member
// missing, RAID-6 with two) acknowledges a write only once it is durable:
// a survivor's power cut (its drive's volatile cache lost) then loses no
// acknowledged write. Before, the degraded writes sat in the survivors'
// caches; member 0's power cut reverted them, the array failed, and the
// re-assembly served the old blocks (docs/RELIABILITY.md known problem 8,
// simulation seed 166: `kill E at 17 for 30; power C at 26 for 4`).
func TestPowerCutOfASurvivorLosesNoAcknowledgedWrite(t *testing.T) {
	for _, tc := range []struct {
		level Level
		n     int
		out   []int
	}{{RAID5, 3, []int{2}}, {RAID6, 4, []int{2, 3}}} {
		t.Run(fmt.Sprintf("%s-%d", tc.level, tc.n), func(t *testing.T) {
			ev := &events{}
			ms := newMems(tc.n, 1<<20)
			fs := faults(ms)
			a, err := Create(devs(fs), testCfg(tc.level, ev))
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewSource(166))
			model := randBuf(rng, int(a.Size()))
			mustWrite(t, a, 0, model)
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			// The members go away (their nodes die) and the array sees it.
			for _, r := range tc.out {
				fs[r].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
			}
			if err := a.Flush(); err != nil {
				t.Fatalf("flush with members %v away: %v", tc.out, err)
			}
			if st := a.Status(); st.State != "degraded" {
				t.Fatalf("with members %v away: %q (%s), want degraded", tc.out, st.State, st.Reason)
			}
			// Acknowledged writes with no redundancy left, then member 0's
			// node loses power: every write its drive did not make durable
			// is gone, and it is unreachable.
			randomWrites(t, a, rng, model, 32)
			ms[0].Crash()
			fs[0].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
			_ = a.Flush()
			a.Abort()
			// Every node is back: the owner re-assembles.
			for _, f := range fs {
				f.ClearRules()
			}
			b := mustAssemble(t, devs(fs), AssembleOptions{UUID: a.UUID(), Epoch: 2, Policy: quietPolicy(ev)})
			b.WaitIdle()
			expectEqual(t, "data after member 0's power cut and the re-assembly", mustRead(t, b, 0, int(b.Size())), model)
		})
	}
}
