package target

import (
	"bytes"
	"sync/atomic"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/local"
	"tier0/daemon/nvme"
)

// lendCounter is a memory device that counts copies (ReadAt), loans and
// loans not yet returned.
type lendCounter struct {
	*local.Memory
	copies, loans, out atomic.Int64
}

type countedLoan struct {
	blockdev.Loan
	d *lendCounter
}

func (l countedLoan) Return() { l.d.out.Add(-1); l.Loan.Return() }

func (d *lendCounter) ReadAt(p []byte, off int64) (int, error) {
	d.copies.Add(1)
	return d.Memory.ReadAt(p, off)
}

func (d *lendCounter) LendAt(iov [][]byte, off, length int64) (blockdev.Loan, [][]byte, error) {
	l, iov, err := d.Memory.LendAt(iov, off, length)
	if err != nil {
		return nil, iov, err
	}
	d.loans.Add(1)
	d.out.Add(1)
	return countedLoan{l, d}, iov, nil
}

// TestReadsBorrowALendersMemory: a large read of a device that lends its
// memory (blockdev.Lender) is sent from the device's own memory, with and
// without data digests, and its loan is returned once the data is written
// (before the next response goes out); small reads still copy.
func TestReadsBorrowALendersMemory(t *testing.T) {
	mem, err := local.NewMemory(testSize, testBS)
	if err != nil {
		t.Fatal(err)
	}
	dev := &lendCounter{Memory: mem}
	_, addr := newTarget(t, Config{}, dev)
	for _, digest := range []uint8{0, nvme.DigestHeader | nvme.DigestData} {
		_, id := adminConnect(t, addr, digest, testHostNQN, testHostID)
		q := ioConnect(t, addr, digest, testHostNQN, testHostID, id, 1)
		data := make([]byte, 128<<10)
		for i := range data {
			data[i] = byte(i*7 + int(digest))
		}
		const slba = 64 // 32 KiB: the read spans three 64 KiB chunks
		if r := q.writeBlocks(1, slba, data, testBS, false); !r.cqe.Status.OK() {
			t.Fatalf("write: %v", r.cqe.Status)
		}
		copies, loans := dev.copies.Load(), dev.loans.Load()
		r := q.read(1, slba, uint32(len(data)/testBS), testBS)
		if !r.cqe.Status.OK() || !bytes.Equal(r.data, data) {
			t.Fatalf("digest %d: 128 KiB read of a lending device: %v, data equal %v", digest, r.cqe.Status, bytes.Equal(r.data, data))
		}
		if c, l := dev.copies.Load()-copies, dev.loans.Load()-loans; c != 0 || l != 1 {
			t.Fatalf("digest %d: a 128 KiB read made %d copies and %d loans, want 0 and 1", digest, c, l)
		}
		// The writer returns a round's loans before it writes the next
		// round, so once this response is here the read's loan is back.
		if r := q.read(1, slba, 8, testBS); !r.cqe.Status.OK() || !bytes.Equal(r.data, data[:8*testBS]) {
			t.Fatalf("digest %d: 4 KiB read: %v", digest, r.cqe.Status)
		}
		if n := dev.out.Load(); n != 0 {
			t.Fatalf("digest %d: %d loans outstanding after the next response, want 0", digest, n)
		}
		if c, l := dev.copies.Load()-copies, dev.loans.Load()-loans; c != 1 || l != 1 {
			t.Fatalf("digest %d: a 4 KiB read made %d copies and %d loans, want 1 copy (below lendMin)", digest, c, l)
		}
		q.nc.Close()
	}
}
