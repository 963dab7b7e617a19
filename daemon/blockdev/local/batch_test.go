package local

import (
	"bytes"
	"errors"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"tier0/daemon/blockdev"
)

// heldBatch holds the first io_submit of a ring until release is closed and
// records every batch the submitter hands to the kernel (opcode, offset,
// flags of each iocb).
type heldBatch struct {
	mu      sync.Mutex
	held    bool
	entered chan struct{} // closed when the first submission is held
	release chan struct{}
	batches [][]iocb
}

func holdFirstSubmit(t *testing.T, r *aioRing) *heldBatch {
	h := &heldBatch{entered: make(chan struct{}), release: make(chan struct{})}
	r.beforeSubmit = func(b []*iocb) {
		h.mu.Lock()
		first := !h.held
		h.held = true
		cp := make([]iocb, len(b))
		for i, cb := range b {
			cp[i] = *cb
		}
		h.batches = append(h.batches, cp)
		h.mu.Unlock()
		if first {
			close(h.entered)
			<-h.release
		}
	}
	t.Cleanup(func() { r.beforeSubmit = nil })
	return h
}

// waitQueued yields until n iocbs have been queued on r.
func waitQueued(r *aioRing, n int64) {
	for r.queued.Load() < n {
		runtime.Gosched()
	}
}

func aioDevice(t *testing.T, depth int) *Device {
	d := openFile(t, 4<<20, Options{MaxInFlight: depth})
	if d.ring == nil {
		t.Skip("Linux AIO unavailable here: nothing to batch")
	}
	return d
}

// TestAIOBatchesSubmissions: requests that arrive while a submission is in
// progress go to the kernel together, in one io_submit, and each caller
// gets its own result; the data lands where each asked.
func TestAIOBatchesSubmissions(t *testing.T) {
	d := aioDevice(t, 16)
	h := holdFirstSubmit(t, d.ring)
	const n = 9
	bufs := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		bufs[i] = blockdev.AlignedBuffer(8192)
		copy(bufs[i], pattern(8192, int64(i+10)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = d.WriteAt(bufs[i], int64(i)*8192)
		}()
		if i == 0 {
			<-h.entered // the first caller became the submitter, held with its batch gathered
		}
	}
	waitQueued(d.ring, n)
	close(h.release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	if got := d.ring.submitCalls.Load(); got != 2 {
		t.Errorf("%d requests took %d io_submit calls, want 2 (the held batch, then all queued behind it in one batch)", n, got)
	}
	if len(h.batches) == 2 && len(h.batches[0])+len(h.batches[1]) != n {
		t.Errorf("batches of %d and %d iocbs, want %d in all", len(h.batches[0]), len(h.batches[1]), n)
	}
	for i := range n {
		r := blockdev.AlignedBuffer(8192)
		if _, err := d.ReadAt(r, int64(i)*8192); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r, bufs[i]) {
			t.Fatalf("block %d does not hold write %d's data", i, i)
		}
	}
}

// TestAIOBatchOneRefused: an iocb the kernel refuses at io_submit (here a
// bad file descriptor) in the middle of a batch fails alone; the requests
// before and after it in the same batch complete.
func TestAIOBatchOneRefused(t *testing.T) {
	d := aioDevice(t, 16)
	h := holdFirstSubmit(t, d.ring)
	const n = 7
	const bad = 3
	res := make([]error, n)
	cnt := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fd := d.fd
			if i == bad {
				fd = 1 << 30 // not an open descriptor: EBADF from io_submit
			}
			cnt[i], res[i] = d.ring.do(fd, false, blockdev.AlignedBuffer(4096), int64(i)*4096, 0)
		}()
		if i == 0 {
			<-h.entered // the first submission is held with its batch gathered
		}
	}
	waitQueued(d.ring, n)
	close(h.release)
	wg.Wait()
	for i := range n {
		if i == bad {
			if !errors.Is(res[i], unix.EBADF) {
				t.Errorf("request %d with a bad descriptor: %v, want EBADF", i, res[i])
			}
			continue
		}
		if res[i] != nil || cnt[i] != 4096 {
			t.Errorf("request %d in the same batch: %d bytes, %v; want 4096 bytes and no error", i, cnt[i], res[i])
		}
	}
	// the refused iocb costs two extra io_submit calls at most: after the
	// held batch, the rest goes in one call that stops at the refused
	// iocb, one that fails on it, one with the rest after it
	if len(h.batches) < 2 || len(h.batches) > 4 || len(h.batches[0])+len(h.batches[1]) != n {
		t.Fatalf("%d batches, want the held one and then the rest of the %d requests in one batch", len(h.batches), n)
	}
}

// TestAIOBatchCompletionError: an iocb that the kernel accepts but fails
// (a write past the file system's largest file: EFBIG in its completion
// event) fails alone; the others of its batch succeed.
func TestAIOBatchCompletionError(t *testing.T) {
	d := aioDevice(t, 16)
	h := holdFirstSubmit(t, d.ring)
	const n = 5
	res := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := int64(i) * 4096
			if i == 2 {
				off = 1 << 50 // 1 PiB: past ext4's and xfs's largest file
			}
			_, res[i] = d.ring.do(d.fd, true, blockdev.AlignedBuffer(4096), off, 0)
		}()
		if i == 0 {
			<-h.entered // the first submission is held with its batch gathered
		}
	}
	waitQueued(d.ring, n)
	close(h.release)
	wg.Wait()
	for i, err := range res {
		if (i == 2) != (err != nil) {
			t.Errorf("request %d: %v (only request 2, past the largest file, should fail)", i, err)
		}
	}
	if !errors.Is(res[2], unix.EFBIG) && !errors.Is(res[2], unix.EINVAL) {
		t.Errorf("write at 1 PiB: %v, want EFBIG (or EINVAL)", res[2])
	}
}

// TestAIOBatchKeepsFUA: in one batch of plain and FUA writes each iocb keeps
// its own RWF_DSYNC flag (FUA must not be dropped, nor spread to the
// others).
func TestAIOBatchKeepsFUA(t *testing.T) {
	d := aioDevice(t, 16)
	h := holdFirstSubmit(t, d.ring)
	const n = 7
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := blockdev.AlignedBuffer(4096)
			var err error
			if i%2 == 1 {
				_, err = d.WriteAtFUA(b, int64(i)*4096)
			} else {
				_, err = d.WriteAt(b, int64(i)*4096)
			}
			if err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		}()
		if i == 0 {
			<-h.entered // the first submission is held with its batch gathered
		}
	}
	waitQueued(d.ring, n)
	close(h.release)
	wg.Wait()
	if len(h.batches) != 2 || len(h.batches[0])+len(h.batches[1]) != n {
		t.Fatalf("%d batches, want the held one and then the rest of the %d writes in one", len(h.batches), n)
	}
	for _, b := range h.batches {
		for _, cb := range b {
			fua := cb.offset/4096%2 == 1
			if (cb.rwFlags&unix.RWF_DSYNC != 0) != fua || cb.opcode != iocbCmdPwrite {
				t.Errorf("iocb at %d: opcode %d flags %#x; want a write with RWF_DSYNC exactly when FUA", cb.offset, cb.opcode, cb.rwFlags)
			}
		}
	}
}

// TestAIOLoneRequestNotDelayed: a request with nothing else in flight is
// submitted at once, alone (combining never waits for company).
func TestAIOLoneRequestNotDelayed(t *testing.T) {
	d := aioDevice(t, 16)
	for i := range 4 {
		if _, err := d.ReadAt(blockdev.AlignedBuffer(4096), int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if c, q := d.ring.submitCalls.Load(), d.ring.queued.Load(); c != 4 || q != 4 {
		t.Fatalf("4 sequential reads: %d io_submit calls for %d queued, want 4 and 4", c, q)
	}
}
