package node

import (
	"context"
	"encoding/json"
	"sync"
	"time"
)

// A report is an edge: "the array failed here", "the resync finished",
// "the assembly is done". The coordinator's state machine changes only when
// it hears one, so a report the store did not take is a decision that never
// comes (an array failed during a store cut stayed unserved after both
// members and store came back: the machine still believed it served,
// docs/RELIABILITY.md known problem 7). Reports therefore go through an
// outbox: sendReport queues the report and delivers the queue in order,
// head first; a delivery the store refuses stays at the head and is tried
// again by the next report and by the housekeeping tick, until it lands.
// The order is kept, so the machine never sees a later report before an
// earlier one of the same node.

// outboxLimit bounds the reports kept while the store is unreachable;
// beyond it the oldest progress reports go first, then the oldest of any
// kind (logged: the coordinator's step timeouts and the node's next
// report bring the state back).
const outboxLimit = 1024

// outbox is a node's queue of undelivered reports.
type outbox struct {
	mu      sync.Mutex // guards queue
	queue   []queued
	sending sync.Mutex // held by the one goroutine delivering
}

// queued is one report waiting: its key suffix (assigned at queueing, so
// keys sort in the order the reports were made) and its encoding.
type queued struct {
	seq  string
	kind string
	body []byte
}

// sendReport queues a report and delivers what is queued.
func (n *Node) sendReport(r report) {
	if r.Node == "" {
		r.Node = n.me.Name
	}
	b, _ := json.Marshal(r)
	o := &n.out
	o.mu.Lock()
	if len(o.queue) >= outboxLimit {
		o.queue = dropOldest(o.queue)
		n.log.Warn("report outbox full while the store is unreachable: dropped the oldest report", "limit", outboxLimit)
	}
	o.queue = append(o.queue, queued{seq: n.seq(), kind: r.Kind, body: b})
	o.mu.Unlock()
	n.flushReports()
}

// dropOldest removes the oldest progress report, or the oldest report.
func dropOldest(q []queued) []queued {
	for i, e := range q {
		if e.kind == "progress" {
			return append(q[:i], q[i+1:]...)
		}
	}
	return q[1:]
}

// flushReports delivers the queued reports in order until the queue is
// empty or the store refuses one. Only one goroutine delivers at a time;
// another that finds it busy leaves its report to that one, which looks
// at the queue again before it returns.
func (n *Node) flushReports() {
	o := &n.out
	for {
		if !o.sending.TryLock() {
			return
		}
		ok := n.deliverQueued()
		o.sending.Unlock()
		if !ok {
			return
		}
		o.mu.Lock()
		empty := len(o.queue) == 0
		o.mu.Unlock()
		if empty {
			return
		}
	}
}

// deliverQueued puts the queued reports into the store, head first; false
// when the store refused one (it stays queued).
func (n *Node) deliverQueued() bool {
	o := &n.out
	for {
		o.mu.Lock()
		if len(o.queue) == 0 {
			o.mu.Unlock()
			return true
		}
		head := o.queue[0]
		o.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := n.st.Client().Put(ctx, n.key("reports", head.seq), string(head.body))
		cancel()
		if err != nil {
			n.log.Warn("report not delivered yet: kept, and sent again when the store answers", "report", head.kind, "err", err)
			return false
		}
		o.mu.Lock()
		if len(o.queue) > 0 && o.queue[0].seq == head.seq {
			o.queue = o.queue[1:]
		}
		o.mu.Unlock()
	}
}

// pendingReports is how many reports wait for the store.
func (n *Node) pendingReports() int {
	n.out.mu.Lock()
	defer n.out.mu.Unlock()
	return len(n.out.queue)
}
