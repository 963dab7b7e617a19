package node

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/cluster"
	"tier0/daemon/store"
)

// The task protocol. The coordinator writes each action addressed to a
// node under tasks/<node>/<seq>; the node performs it, deletes the key and
// writes what happened under reports/<seq> as a report, which the
// coordinator turns back into a state machine event and deletes. Actions
// carry the ownership epoch, and a node checks it against the store before
// acting, so a task that outlived its decision does nothing harmful.

// task is one action for a node.
type task struct {
	Kind   string          `json:"kind"`
	Action json.RawMessage `json:"action"`
}

// report is the outcome of a task, or an observation of the owner.
type report struct {
	Kind        string `json:"kind"` // an event name of package cluster
	Array       string `json:"array,omitempty"`
	Node        string `json:"node,omitempty"`
	Epoch       uint64 `json:"epoch,omitempty"`
	Member      string `json:"member,omitempty"`
	Percent     int    `json:"percent,omitempty"`
	Reason      string `json:"reason,omitempty"`
	Winner      string `json:"winner,omitempty"`
	WinnerEpoch uint64 `json:"winner_epoch,omitempty"`
	Started     int64  `json:"started,omitempty"` // "returned": the registration (cluster.NodeReturned)
	Fences      uint64 `json:"fences,omitempty"`
}

// event converts a report into the state machine's event.
func (r report) event() (cluster.Event, error) {
	switch r.Kind {
	case "fence-done":
		return cluster.FenceDone{Array: r.Array, Node: r.Node, Epoch: r.Epoch}, nil
	case "fence-failed":
		return cluster.FenceFailed{Array: r.Array, Node: r.Node, Epoch: r.Epoch, Reason: r.Reason}, nil
	case "ownership-lost":
		return cluster.OwnershipLost{Array: r.Array, Node: r.Node, Epoch: r.Epoch, Winner: r.Winner, WinnerEpoch: r.WinnerEpoch}, nil
	case "assembled":
		return cluster.ArrayAssembled{Array: r.Array, Node: r.Node, Epoch: r.Epoch}, nil
	case "assemble-failed":
		return cluster.AssembleFailed{Array: r.Array, Node: r.Node, Epoch: r.Epoch, Reason: r.Reason}, nil
	case "released":
		return cluster.Released{Array: r.Array, Node: r.Node, Epoch: r.Epoch}, nil
	case "resync-done":
		return cluster.ResyncDone{Array: r.Array, Member: r.Member, Epoch: r.Epoch}, nil
	case "rebuild-done":
		return cluster.RebuildDone{Array: r.Array, Member: r.Member, Epoch: r.Epoch}, nil
	case "progress":
		return cluster.RebuildProgress{Array: r.Array, Member: r.Member, Percent: r.Percent, Epoch: r.Epoch}, nil
	case "member-failed":
		return cluster.MemberFailed{Array: r.Array, Member: r.Member, Epoch: r.Epoch}, nil
	case "drain":
		return cluster.DrainRequested{Node: r.Node}, nil
	case "undrain":
		return cluster.UndrainRequested{Node: r.Node}, nil
	case "failback":
		return cluster.FailbackRequested{Array: r.Array}, nil
	case "array-failed":
		return cluster.ArrayFailed{Array: r.Array, Node: r.Node, Epoch: r.Epoch, Reason: r.Reason}, nil
	case "repair-failed":
		return cluster.RepairFailed{Array: r.Array, Member: r.Member, Epoch: r.Epoch, Reason: r.Reason}, nil
	case "drive-replaced":
		return cluster.DriveReplaced{Drive: r.Member}, nil
	case "returned":
		// The node serves nothing any more (it fenced itself, or found an
		// array it should run stopped): its arrays are to be taken over
		// again under new epochs.
		return cluster.NodeReturned{Node: r.Node, Started: r.Started, Fences: r.Fences}, nil
	}
	return nil, fmt.Errorf("report kind %q is not known", r.Kind)
}

func (n *Node) key(parts ...string) string {
	return "/tier0/" + n.cfg.Cluster + "/" + strings.Join(parts, "/")
}

var seqCounter atomic.Uint64

// seq is a key suffix that sorts in creation order.
func (n *Node) seq() string {
	return fmt.Sprintf("%020d-%06d", n.clk().Now().UnixNano(), seqCounter.Add(1)%1000000)
}

// sendTask hands an action to its node.
func (n *Node) sendTask(ctx context.Context, a cluster.Action) error {
	kind := strings.ToLower(fmt.Sprintf("%T", a))
	kind = kind[strings.LastIndex(kind, ".")+1:]
	raw, err := json.Marshal(a)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(task{Kind: kind, Action: raw})
	key := n.key("tasks", a.Performer(), n.seq())
	// Under the coordinator term's election (withViewGuard): a coordinator
	// superseded while it was frozen hands out nothing once it thaws.
	if guard, _ := ctx.Value(viewGuardKey{}).(store.Guard); guard != nil {
		resp, err := n.st.Client().Txn(ctx).If(*guard).Then(clientv3.OpPut(key, string(b))).Commit()
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("task %s for %s refused: this node is not the coordinator any more: %w", kind, a.Performer(), store.ErrNotLeader)
		}
		return err
	}
	_, err = n.st.Client().Put(ctx, key, string(b))
	return err
}

// taskLoop performs the tasks addressed to this node, in order per array.
func (n *Node) taskLoop(ctx context.Context) error {
	prefix := n.key("tasks", n.me.Name) + "/"
	queues := map[string]chan task{}
	queue := func(name string) chan task {
		q, ok := queues[name]
		if !ok {
			q = make(chan task, 64)
			queues[name] = q
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case t := <-q:
						n.perform(ctx, t)
					}
				}
			}()
		}
		return q
	}
	handle := func(key string, value []byte) {
		var t task
		if err := json.Unmarshal(value, &t); err != nil {
			n.log.Warn("malformed task dropped", "key", key, "err", err)
		} else {
			var probe struct{ Array string }
			_ = json.Unmarshal(t.Action, &probe)
			queue(probe.Array) <- t
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _ = n.st.Client().Delete(dctx, key)
		cancel()
	}
	cli := n.st.Client()
	for ctx.Err() == nil {
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			n.clk().Sleep(500 * time.Millisecond)
			continue
		}
		kvs := resp.Kvs
		sort.Slice(kvs, func(i, j int) bool { return string(kvs[i].Key) < string(kvs[j].Key) })
		for _, kv := range kvs {
			handle(string(kv.Key), kv.Value)
		}
		o := store.WatchOptions{Rev: resp.Header.Revision + 1, Any: true}
		for kv := range store.WatchPrefix(ctx, cli, prefix, o, store.Puts) {
			handle(kv.Key, kv.Value)
		}
	}
	return nil
}

// perform runs one task.
func (n *Node) perform(ctx context.Context, t task) {
	var err error
	n.catchUpOnline(ctx, t.Action)
	switch t.Kind {
	case "fence":
		var a cluster.Fence
		if err = json.Unmarshal(t.Action, &a); err == nil {
			n.doFence(ctx, a)
		}
	case "assemble":
		var a cluster.Assemble
		if err = json.Unmarshal(t.Action, &a); err == nil {
			n.doAssemble(ctx, a)
		}
	case "release":
		var a cluster.Release
		if err = json.Unmarshal(t.Action, &a); err == nil {
			n.doRelease(ctx, a)
		}
	case "setana":
		var a cluster.SetANA
		if err = json.Unmarshal(t.Action, &a); err == nil {
			n.doSetANA(ctx, a)
		}
	case "resync", "rebuild":
		var a cluster.Resync
		if err = json.Unmarshal(t.Action, &a); err == nil {
			n.doRepair(ctx, a, t.Kind == "rebuild")
		}
	case "failmember":
		var a failMember
		if err = json.Unmarshal(t.Action, &a); err == nil {
			n.doFailMember(ctx, a)
		}
	case "scrubarray":
		var a scrubArray
		if err = json.Unmarshal(t.Action, &a); err == nil {
			n.doScrub(ctx, a)
		}
	case "selffence":
		n.selfFence("the coordinator says this node lost its lease")
	case "export":
		// The backend exports every local drive from start to stop.
	default:
		n.log.Warn("unknown task ignored", "kind", t.Kind)
	}
	if err != nil {
		n.log.Warn("malformed task", "kind", t.Kind, "err", err)
	}
}
