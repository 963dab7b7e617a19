package target

import (
	"bytes"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// TestWriteZeroesFUA is issue 12 hole 7: a Write Zeroes with FUA (with and
// without DEAC) must be durable when it completes; a power loss right
// after it (blockdev.Mem.Crash drops what was not flushed) must not bring
// the old data back. A Write Zeroes without FUA stays volatile, as the
// device's write cache allows.
func TestWriteZeroesFUA(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cdw12   uint32
		durable bool
	}{
		{"fua", nvme.CmdWriteFUABit, true},
		{"fua+deac", nvme.CmdWriteFUABit | nvme.CmdWriteZeroesDeac, true},
		{"no fua", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := blockdev.NewMem(testSize, testBS)
			_, addr := newTarget(t, Config{}, mem)
			_, id := adminConnect(t, addr, 0, testHostNQN, testHostID)
			q := ioConnect(t, addr, 0, testHostNQN, testHostID, id, 1)
			old := bytes.Repeat([]byte{0x5A}, 8*testBS)
			w := rwSQE(nvme.CmdWrite, 1, 0, 8)
			w.CDW12 |= nvme.CmdWriteFUABit
			if r := q.do(w, old, true); !r.cqe.Status.OK() {
				t.Fatalf("FUA write: %v", r.cqe.Status)
			}
			z := rwSQE(nvme.CmdWriteZeroes, 1, 2, 4)
			z.CDW12 |= tc.cdw12
			if r := q.do(z, nil, false); !r.cqe.Status.OK() {
				t.Fatalf("write zeroes (cdw12 %#x): %v", z.CDW12, r.cqe.Status)
			}
			mem.Crash()
			got := make([]byte, 8*testBS)
			if _, err := mem.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			want := bytes.Clone(old)
			if tc.durable {
				clear(want[2*testBS : 6*testBS])
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("after a crash following write zeroes (cdw12 %#x): blocks 2..5 start %#x, want %#x (durable %v); blocks 0,1,6,7 must keep 0x5a",
					z.CDW12, got[2*testBS], want[2*testBS], tc.durable)
			}
		})
	}
}
