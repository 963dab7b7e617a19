package raid

import (
	"math/rand"
	"testing"

	"tier0/daemon/blockdev"
)

// incDev is a member connection that knows the incarnation (power cycle)
// of the node it was made to.
type incDev struct {
	*blockdev.Fault
	inc uint64
}

func (d incDev) Incarnation() uint64 { return d.inc }

func incDevs(fs []*blockdev.Fault, incs []uint64) []blockdev.Device {
	ds := make([]blockdev.Device, len(fs))
	for i, f := range fs {
		ds[i] = incDev{f, incs[i]}
	}
	return ds
}

// The owner's backend is cut: the array fails on every member at once,
// with writes acknowledged but not yet flushed on them. Meanwhile member
// 0's node loses power (its drive's cache with those writes). At the
// re-assembly every member says it is as current as the others; member
// 0's restart (a new incarnation) makes it catch up the bitmap's dirty
// regions from the others instead. Before, it was taken as current and
// its old blocks were served (docs/RELIABILITY.md known problem 8, seeds
// 915 and 876 of the simulation's power cuts).
func TestMemberRestartedWhileArrayFailedCatchesUp(t *testing.T) {
	for _, level := range []Level{RAID5, RAID6} {
		t.Run(level.String(), func(t *testing.T) {
			ev := &events{}
			ms := newMems(4, 1<<20)
			fs := faults(ms)
			incs := []uint64{1, 1, 1, 1}
			a, err := Create(incDevs(fs, incs), testCfg(level, ev))
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewSource(915))
			model := randBuf(rng, int(a.Size()))
			mustWrite(t, a, 0, model)
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			randomWrites(t, a, rng, model, 32) // acknowledged, in the members' caches
			for _, f := range fs {
				f.AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
			}
			if _, err := a.WriteAt(make([]byte, 512), 0); err == nil {
				t.Fatal("a write with every member cut off succeeded")
			}
			if st := a.Status(); st.State != "failed" {
				t.Fatalf("with every member cut off: %q, want failed", st.State)
			}
			a.Abort()
			ms[0].Crash() // member 0's power cut
			incs[0]++
			for _, f := range fs {
				f.ClearRules()
			}
			b := mustAssemble(t, incDevs(fs, incs), AssembleOptions{UUID: a.UUID(), Epoch: 2, Policy: quietPolicy(ev)})
			if st := b.Status(); st.Members[0].State != "rebuilding" {
				t.Errorf("member 0 at the re-assembly: %+v, want rebuilding (its node restarted)", st.Members[0])
			}
			b.WaitIdle()
			expectEqual(t, "data after member 0's power cut and the re-assembly", mustRead(t, b, 0, int(b.Size())), model)
			if st := b.Status(); st.State != "optimal" {
				t.Errorf("after the resync: %q (%s), want optimal", st.State, st.Reason)
			}
		})
	}
}
