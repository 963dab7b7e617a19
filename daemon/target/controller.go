package target

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/nvme"
)

// event kinds a controller can report with an Asynchronous Event Request.
type eventKind uint8

const (
	eventANA eventKind = 1 << iota
	eventNSChanged
	eventDiscovery
	eventResv
)

// maxResvLog bounds a controller's unread reservation notifications; the
// oldest are dropped beyond it.
const maxResvLog = 255

// controller is one NVMe controller: an admin queue plus I/O queues of one
// host on one subsystem.
type controller struct {
	t       *Target
	sub     *subsystem
	id      uint16
	hostNQN string
	hostID  [16]byte
	kato    atomic.Uint32 // ms
	seen    atomic.Int64  // unix nanos of the last command

	mu        sync.Mutex
	admin     *conn
	ioq       map[uint16]*conn
	numIOQ    int
	cc, csts  uint32
	aec       uint32
	aers      []uint16 // CIDs of outstanding Asynchronous Event Requests
	pending   eventKind
	changedNS []uint32
	resvMask  uint32
	// resvLog holds unread reservation notification log pages; resvAEN
	// is set while an event announcing them is outstanding (no further
	// one until the host reads the log).
	resvLog   []nvme.ResvNotification
	resvCount uint64
	resvAEN   bool
	dead      bool
}

// resvNotify queues a reservation notification (nvme.ResvNotif*) for
// namespace nsid unless the host masked it, and raises the event.
func (c *controller) resvNotify(typ uint8, nsid uint32) {
	c.mu.Lock()
	if c.dead || c.resvMask&(1<<typ) != 0 {
		c.mu.Unlock()
		return
	}
	c.resvCount++
	if c.resvCount == 0 {
		c.resvCount = 1
	}
	if len(c.resvLog) >= maxResvLog {
		c.resvLog = c.resvLog[1:]
	}
	c.resvLog = append(c.resvLog, nvme.ResvNotification{LogPageCount: c.resvCount, Type: typ, NSID: nsid})
	if !c.resvAEN {
		c.pending |= eventResv
	}
	c.deliverLocked()
	c.mu.Unlock()
}

// readResvLog pops the oldest reservation notification (an empty page
// when there is none); reading with rae clear re-arms the event.
func (c *controller) readResvLog(rae bool) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	var p nvme.ResvNotification
	if len(c.resvLog) > 0 {
		p = c.resvLog[0]
		c.resvLog = c.resvLog[1:]
		p.NumAvail = uint8(min(len(c.resvLog), 255))
	}
	if !rae {
		c.resvAEN = false
		if len(c.resvLog) > 0 {
			c.pending |= eventResv
			c.deliverLocked()
		}
	}
	return p.Append(nil)
}

func (c *controller) touch() { c.seen.Store(c.t.cfg.Clock.Now().UnixNano()) }

func (c *controller) katoMillis() uint32 { return c.kato.Load() }

func (c *controller) kaExpired(now time.Time) bool {
	k := c.kato.Load()
	if k == 0 {
		return false
	}
	return now.UnixNano()-c.seen.Load() > int64(k)*int64(time.Millisecond)
}

// shutdown tears the controller down: it closes every queue's connection
// and frees its ID. Safe to call more than once.
func (c *controller) shutdown() {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.dead = true
	conns := []*conn{}
	if c.admin != nil {
		conns = append(conns, c.admin)
	}
	ioqs := make([]*conn, 0, len(c.ioq))
	for _, q := range c.ioq {
		conns = append(conns, q)
		ioqs = append(ioqs, q)
	}
	c.aers = nil
	c.mu.Unlock()
	// The I/O queues count as draining, and are closed (their queued
	// commands dropped from now on), before the controller ID is freed: a
	// reconnect of the host can never slip in between, and no worker
	// starts a queued command once the controller is gone.
	for _, q := range ioqs {
		q.beginDrain(c)
	}
	for _, q := range conns {
		q.close()
	}
	c.sub.mu.Lock()
	delete(c.sub.ctrls, c.id)
	c.sub.mu.Unlock()
	c.t.mu.Lock()
	if c.t.ctrls[c.id] == c {
		delete(c.t.ctrls, c.id)
	}
	c.t.mu.Unlock()
}

// draining reports how many dead I/O queues of host h on s still have
// commands executing, and a channel closed when the next drain ends.
func (s *subsystem) draining(h hostKey) (int, <-chan struct{}) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.drains[h], s.drained
}

// awaitDrained waits up to d for host h's dead I/O queues on s to finish
// their commands (or for stop); it returns how many still run.
func (s *subsystem) awaitDrained(h hostKey, d time.Duration, stop <-chan struct{}) int {
	tm := time.NewTimer(d)
	defer tm.Stop()
	for {
		n, ch := s.draining(h)
		if n == 0 {
			return 0
		}
		select {
		case <-ch:
		case <-tm.C:
			n, _ = s.draining(h)
			return n
		case <-stop:
			return n
		}
	}
}

// postEvent records an event and completes an outstanding Asynchronous
// Event Request if the host enabled that event.
func (c *controller) postEvent(k eventKind) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.pending |= k
	c.deliverLocked()
	c.mu.Unlock()
}

func (c *controller) nsChanged(nsid uint32) {
	c.mu.Lock()
	if len(c.changedNS) < 1024 && !slices.Contains(c.changedNS, nsid) {
		c.changedNS = append(c.changedNS, nsid)
	} else if len(c.changedNS) >= 1024 {
		c.changedNS = []uint32{0xFFFFFFFF}
	}
	c.mu.Unlock()
	c.postEvent(eventNSChanged)
}

// deliverLocked completes AERs for pending, enabled events. c.mu held.
func (c *controller) deliverLocked() {
	for len(c.aers) > 0 && c.pending != 0 {
		var result uint32
		switch {
		case c.pending&eventANA != 0:
			c.pending &^= eventANA
			if c.aec&nvme.OAESANAChange == 0 {
				continue
			}
			result = nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeANAChange, nvme.LogANA)
		case c.pending&eventNSChanged != 0:
			c.pending &^= eventNSChanged
			if c.aec&nvme.OAESNSAttr == 0 {
				continue
			}
			result = nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeNSChanged, nvme.LogChangedNSList)
		case c.pending&eventDiscovery != 0:
			c.pending &^= eventDiscovery
			if c.aec&nvme.OAESDiscoChanged == 0 {
				continue
			}
			result = nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeDiscoChanged, nvme.LogDiscovery)
		case c.pending&eventResv != 0:
			c.pending &^= eventResv
			if len(c.resvLog) == 0 || c.resvAEN {
				continue
			}
			c.resvAEN = true
			result = nvme.AENResult(nvme.AENTypeIOCmdSpec, nvme.AENIOResvLogAvail, nvme.LogResvNotification)
		}
		cid := c.aers[0]
		c.aers = c.aers[1:]
		if c.admin != nil {
			c.admin.sendCQE(nvme.CQE{Result: uint64(result), CID: cid})
		}
	}
}
