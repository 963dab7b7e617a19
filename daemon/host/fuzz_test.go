package host

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"tier0/daemon/nvme"
)

// FuzzQueueRead feeds arbitrary controller-to-host bytes to a queue with
// commands in flight: the reader must never panic or write outside the
// caller's buffers, and must end (failing every command) when the stream
// is bad or closed.
func FuzzQueueRead(f *testing.F) {
	for _, dg := range []uint8{0, nvme.DigestHeader | nvme.DigestData} {
		cqe := nvme.CQE{CID: 1}
		f.Add(dg, nvme.AppendCapsuleResp(nil, &cqe, dg))
		d := nvme.DataPDU{Type: nvme.PDUC2HData, CID: 0, Length: 512, Flags: nvme.FlagDataLast | nvme.FlagDataSuccess}
		b := d.Append(nil, dg)
		data := make([]byte, 512)
		b = append(b, data...)
		if dg&nvme.DigestData != 0 {
			b = nvme.AppendDigest(b, data)
		}
		f.Add(dg, b)
		f.Add(dg, nvme.R2T{CID: 2, TTag: 1, Offset: 0, Length: 4096}.Append(nil, dg))
		f.Add(dg, nvme.R2T{CID: 2, TTag: 1, Offset: 4096, Length: 1 << 30}.Append(nil, dg))
		f.Add(dg, (&nvme.DataPDU{Type: nvme.PDUC2HData, CID: 0, Offset: 1 << 20, Length: 16}).Append(nil, dg))
		f.Add(dg, nvme.TermReq{Type: nvme.PDUC2HTermReq, FES: nvme.FESPDUSequence}.Append(nil))
	}
	f.Fuzz(func(t *testing.T, dg uint8, in []byte) {
		dg &= nvme.DigestHeader | nvme.DigestData
		hc, tc := net.Pipe()
		defer tc.Close()
		q := &queue{conn: hc, log: slog.New(slog.DiscardHandler), dead: make(chan struct{})}
		q.init(dg, 4096, 4)
		// commands 0 (read 8 KiB), 1 (no data), 2 (write 8 KiB) in flight
		rbuf := make([]byte, 8192+64)
		for range q.slots {
			<-q.free
		}
		q.rmu.Lock()
		q.slots[0].rbuf, q.slots[0].active = rbuf[:8192], true
		q.slots[1].active = true
		q.slots[2].wbuf, q.slots[2].active = make([]byte, 8192), true
		q.rmu.Unlock()
		go io.Copy(io.Discard, tc) // H2CData the queue sends
		go func() {
			tc.Write(in)
			tc.Close()
		}()
		select {
		case <-q.readerDone:
		case <-time.After(10 * time.Second):
			t.Fatal("reader did not end after the stream closed")
		}
		for i := 8192; i < len(rbuf); i++ {
			if rbuf[i] != 0 {
				t.Fatalf("reader wrote past the caller's buffer at byte %d", i)
			}
		}
	})
}
