package target

import (
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// dataDir returns the data direction of a command: 1 host to controller,
// 2 controller to host, 0 none, 3 bidirectional.
func dataDir(s *nvme.SQE) uint8 {
	if s.Opcode == nvme.AdminFabrics {
		return s.FCType() & 3
	}
	return s.Opcode & 3
}

// start validates the data descriptor of a new command, requests its data
// with an R2T when it is not in the capsule, and dispatches it.
func (c *conn) start(r *request) {
	s := &r.sqe
	if c.ctrl == nil && !(s.Opcode == nvme.AdminFabrics && s.FCType() == nvme.FabricsConnect) {
		c.complete(r, nvme.StatusCmdSeqError|nvme.StatusDNR)
		return
	}
	if c.ctrl != nil {
		c.ctrl.touch()
	}
	if c.auth != nil && !c.auth.admits(s) {
		c.complete(r, nvme.StatusAuthRequired|nvme.StatusDNR)
		return
	}
	if c.rd != nil {
		c.rd.start(r)
		return
	}
	sgl := s.DPTR
	switch dataDir(s) {
	case 1:
		switch sgl.Type {
		case nvme.SGLTypeInCapsule:
			if sgl.Addr != 0 {
				c.complete(r, nvme.StatusSGLInvalidOffset|nvme.StatusDNR)
				return
			}
			if int(sgl.Length) != len(r.data) {
				c.complete(r, nvme.StatusSGLInvalidData|nvme.StatusDNR)
				return
			}
		case nvme.SGLTypeTransport:
			if r.inCapsule {
				c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
				return
			}
			if sgl.Length == 0 {
				break
			}
			if int64(sgl.Length) > int64(c.t.cfg.MaxDataTransfer) {
				c.complete(r, nvme.StatusInvalidField|nvme.StatusDNR)
				return
			}
			r.buf = c.t.pools.get(int(sgl.Length))
			r.data = r.buf.b
			r.want, r.waiting = sgl.Length, true
			c.emit(outItem{isR2T: true, r2t: nvme.R2T{CID: r.sqe.CID, TTag: r.slot, Length: r.want}})
			return
		default:
			c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
			return
		}
	case 2:
		if sgl.Length > 0 && sgl.Type != nvme.SGLTypeTransport {
			c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
			return
		}
		if int64(sgl.Length) > int64(c.t.cfg.MaxDataTransfer) {
			c.complete(r, nvme.StatusInvalidField|nvme.StatusDNR)
			return
		}
	}
	c.dispatch(r)
}

// dispatch runs a command whose data has arrived: admin and fabrics
// commands at once, reads and writes of a namespace that answers fast
// inline after the PDUs of this wake-up are parsed (runBatch), other I/O
// commands on the queue's workers.
func (c *conn) dispatch(r *request) {
	if c.qid == 0 || c.work == nil || r.sqe.Opcode == nvme.CmdFabrics {
		c.t.execute(r)
		return
	}
	if op := r.sqe.Opcode; op == nvme.CmdRead || op == nvme.CmdWrite {
		r.lat = c.latOf(r.sqe.NSID)
		if r.inBuf || (r.lat != nil && c.stalled.Load() == 0 && r.lat.fast()) {
			c.batch = append(c.batch, r)
			return
		}
	}
	select {
	case c.work <- r:
	case <-c.done:
		c.drop(r) // the connection died before the command was queued
	}
}

// latOf returns the latency average of namespace nsid on this queue (nil
// past the first 8 namespaces: their commands always go to the workers).
// Called by the reader.
func (c *conn) latOf(nsid uint32) *nsLat {
	for _, l := range c.lat {
		if l.nsid == nsid {
			return l
		}
	}
	if len(c.lat) >= 8 {
		return nil
	}
	l := &nsLat{nsid: nsid}
	if ns := c.ctrl.namespace(nsid); ns != nil {
		_, l.mem = ns.dev.(blockdev.Lender)
	}
	c.lat = append(c.lat, l)
	return l
}

// runBatch executes the commands gathered for inline execution, under the
// watchdog (onWatch). It returns false when this reader (generation gen)
// lost its role while it executed one.
func (c *conn) runBatch(gen uint64) bool {
	if len(c.batch) == 0 {
		c.bufData = false // a write whose data digest failed is not in it
		return true
	}
	// The timer is started and stored under c.emu: it may fire before the
	// store (a descheduled reader), and onWatch, a take-over's reader and
	// teardown read c.watch under c.emu too.
	c.emu.Lock()
	c.inBatch, c.bi, c.watchSeq = true, 0, c.execSeq
	if c.watch == nil {
		c.watch = newWatch(stallAfter, c.onWatch)
	} else {
		c.watch.Reset(stallAfter)
	}
	c.emu.Unlock()
	t0 := time.Now()
	for {
		c.emu.Lock()
		if c.gen != gen {
			// a stalled command: the batch went to the workers and a new
			// reader took over (takeOver); this goroutine only finishes
			c.emu.Unlock()
			c.stalled.Add(-1)
			c.unpause <- struct{}{}
			c.execWG.Done()
			return false
		}
		if c.bi == len(c.batch) {
			c.inBatch, c.bufData = false, false
			c.batch, c.bi = c.batch[:0], 0
			c.emu.Unlock()
			break
		}
		r := c.batch[c.bi]
		c.bi++
		c.execSeq++
		c.emu.Unlock()
		if c.closing() {
			c.drop(r)
			continue
		}
		l, n := r.lat, r.sqe.DPTR.Length // r is recycled once its answer is written
		c.t.execute(r)
		t1 := time.Now()
		if l != nil {
			l.add(t1.Sub(t0), n)
		}
		t0 = t1
	}
	c.watch.Stop()
	return true
}

// onWatch is the inline watchdog: it hands the reader's role over when the
// command the reader executes has not changed since its last look.
func (c *conn) onWatch() {
	c.emu.Lock()
	defer c.emu.Unlock()
	if !c.inBatch || c.stopped {
		return
	}
	if c.execSeq != c.watchSeq || c.bufData {
		// progress; or writes of the batch hold data in the read
		// buffer, which a new reader would overwrite: a memory
		// namespace's command only waits for the CPU
		c.watchSeq = c.execSeq
		c.watch.Reset(stallAfter)
		return
	}
	c.takeOverLocked()
}

// takeOverLocked (c.emu held) gives the role of the reader stalled in an
// inline command to a new goroutine. The rest of its batch goes to the
// workers, behind a pauseWorker that keeps one worker idle until the
// stalled command returns (so that no more commands execute at once than
// the queue has workers), and the answers it holds are written.
func (c *conn) takeOverLocked() {
	c.gen++
	c.stalled.Add(1)
	c.execWG.Add(1)
	c.work <- pauseWorker // never blocks: room for depth commands and depth pauses
	for _, r := range c.batch[c.bi:] {
		c.work <- r
	}
	c.batch, c.bi, c.inBatch = nil, 0, false
	gen := c.gen
	c.omu.Lock()
	own := c.oplug
	c.oplug, c.oplugReq = false, false
	c.omu.Unlock()
	if own {
		go c.writeOut()
	}
	go c.readLoop(gen) //nolint:errcheck // it ends the connection itself
}

func (c *conn) startWorkers(n int) {
	c.work = make(chan *request, 2*c.depth)
	c.unpause = make(chan struct{}, c.depth)
	for i := 0; i < n; i++ {
		c.workers.Add(1)
		go func() {
			defer c.workers.Done()
			for r := range c.work {
				if r == pauseWorker {
					<-c.unpause
					continue
				}
				if c.closing() {
					// the connection is dead: its host has given up
					// on this command and may resubmit it elsewhere
					c.drop(r)
					continue
				}
				l, n, t0 := r.lat, r.sqe.DPTR.Length, time.Now() // r is recycled once its answer is written
				c.t.execute(r)
				if l != nil {
					l.add(time.Since(t0), n)
				}
			}
		}()
	}
}

// drop discards a command of a closed connection without executing it.
func (c *conn) drop(r *request) {
	c.dropped.Add(1)
	c.freeSlot(r)
	c.t.pools.put(r.buf)
	*r = request{}
	reqPool.Put(r)
}

// hostKey names a host as reservations and the quiesce rule do: host NQN
// and host identifier.
type hostKey struct {
	nqn string
	id  [16]byte
}

// beginDrain counts the I/O queue c of ctrl as draining in its subsystem
// (once; called by teardown and by the controller's shutdown, whichever
// comes first). endDrain, after the workers stopped, ends it.
func (c *conn) beginDrain(ctrl *controller) {
	if ctrl == nil {
		return
	}
	c.drainOnce.Do(func() {
		c.drainSub, c.drainKey, c.drainStart = ctrl.sub, hostKey{ctrl.hostNQN, ctrl.hostID}, time.Now()
		ctrl.sub.mu.Lock()
		ctrl.sub.drains[c.drainKey]++
		ctrl.sub.mu.Unlock()
	})
}

func (c *conn) endDrain() {
	c.drainOnce.Do(func() {}) // a queue never counted stays uncounted
	if s := c.drainSub; s != nil {
		s.mu.Lock()
		if s.drains[c.drainKey]--; s.drains[c.drainKey] <= 0 {
			delete(s.drains, c.drainKey)
		}
		close(s.drained)
		s.drained = make(chan struct{})
		s.mu.Unlock()
		c.drainSub = nil
		if d := time.Since(c.drainStart); d > c.t.cfg.CommandQuiesceTime && c.ctrl != nil {
			c.t.log.Warn("commands of a dead I/O queue outlived the advertised command quiesce time; a host may have resubmitted them already",
				"cntlid", c.ctrl.id, "qid", c.qid, "hostnqn", c.ctrl.hostNQN, "drain", d.Round(time.Millisecond), "cqt", c.t.cfg.CommandQuiesceTime)
		}
	}
	if n := c.dropped.Load(); n > 0 && c.ctrl != nil {
		c.t.log.Info("dropped the commands queued on a closed I/O queue; they were never executed",
			"cntlid", c.ctrl.id, "qid", c.qid, "hostnqn", c.ctrl.hostNQN, "dropped", n)
	}
}
