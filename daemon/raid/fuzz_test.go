package raid

import (
	"errors"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// FuzzSuperblock: superblocks are read from members that may come over the
// network; any bytes must parse or be refused, never panic, and a parsed
// superblock must round-trip.
func FuzzSuperblock(f *testing.F) {
	_, sb, err := layout(RAID6, 6, 64<<10, 512, 64<<20, 4<<20, 8)
	if err != nil {
		f.Fatal(err)
	}
	sb.Events = 3
	f.Add(sb.marshal())
	huge := *sb
	huge.BitmapBytes = 1 << 50 // must be refused before anything is allocated from it
	f.Add(huge.marshal())
	f.Add(make([]byte, sbSlotSize))
	f.Add([]byte(sbMagic))
	f.Fuzz(func(t *testing.T, p []byte) {
		got, err := unmarshalSB(p)
		if err != nil {
			if !errors.Is(err, ErrNoSuperblock) {
				t.Fatalf("error %v does not wrap ErrNoSuperblock", err)
			}
			return
		}
		again, err := unmarshalSB(got.marshal())
		if err != nil || *again != *got {
			t.Fatalf("round trip: %v", err)
		}
		geometryFromSB(got)
	})
}

func TestIOTimeoutFailsMember(t *testing.T) {
	ev := &events{}
	ms := newMems(3, memSize)
	f := blockdev.NewFault(ms[2])
	d := devs(ms)
	d[2] = f
	cfg := testCfg(RAID5, ev)
	cfg.IOTimeout = 2 * time.Second // generous: a loaded CI machine must not trip it
	a := mustCreate(t, d, cfg)
	want := make([]byte, a.Size())
	mustWrite(t, a, 0, want)
	f.AddRule(blockdev.Rule{Op: blockdev.OpRead, Action: blockdev.Delay, Delay: time.Minute})
	t.Cleanup(f.ClearRules)
	start := time.Now()
	expectEqual(t, "read with a hung member", mustRead(t, a, 0, int(a.Size())), want)
	if el := time.Since(start); el > 30*time.Second {
		t.Fatalf("read took %v with a 2 s member timeout", el)
	}
	e, ok := ev.last(MemberFailed)
	if !ok || e.Member != 2 || !contains(e.Reason, "timeout") {
		t.Fatalf("member-failed event %+v, want member 2 with a timeout", e)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
