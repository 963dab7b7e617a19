package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
)

// newNodeCmd is `tier0 node list|drain|undrain|health`.
func newNodeCmd(root *rootOptions) *cobra.Command {
	nodeCmd := &cobra.Command{
		Use:   "node",
		Short: "List nodes, drain a node for maintenance and undrain it, show a node's health",
	}
	o := newClusterGroup(root, nodeCmd)
	nodeCmd.AddCommand(newNodeListCmd(o), newDrainCmd(o, true), newDrainCmd(o, false), newNodeHealthCmd(o))
	return nodeCmd
}

func newNodeListCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every node: failure domain, state, draining, drives, arrays owned",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nodes := func(s api.Status) []cluster.NodeView {
				if s.Nodes == nil {
					return []cluster.NodeView{}
				}
				return s.Nodes
			}
			return show(cmd, o, clusterStatus(nodes), printNodes)
		},
	}
}

// moveResult is the JSON answer of drain and undrain.
type moveResult struct {
	Node   string `json:"node"`
	Action string `json:"action"` // drain, undrain
	// Result is "accepted" (recorded; the move goes on in the background)
	// or, with --wait, "done".
	Result string `json:"result"`
}

// drainOptions are the flags of node drain and node undrain.
type drainOptions struct {
	cluster     *clusterOptions
	drain       bool // drain, else undrain
	wait        bool
	waitTimeout time.Duration
}

func (o *drainOptions) AddFlags(fs *pflag.FlagSet, waitHelp string) {
	fs.BoolVar(&o.wait, "wait", false, waitHelp)
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 30*time.Minute, "give up waiting after this long (exit 1)")
}

func newDrainCmd(co *clusterOptions, drain bool) *cobra.Command {
	o := &drainOptions{cluster: co, drain: drain}
	action, short, long, waitHelp := "drain", "Move every array off a node (before maintenance)",
		"Record that NODE is to be drained: the coordinator hands every array the node\n"+
			"owns to the least loaded eligible node (a planned hand-off: the old owner\n"+
			"releases, then the new one fences and serves) and gives it no new ones.\n"+
			"The drain stays in force across restarts until `tier0 node undrain NODE`.",
		"wait until NODE owns no array and no array is moving"
	if !drain {
		action, short, long, waitHelp = "undrain", "Let a node own arrays again (after maintenance)",
			"Lift the drain of NODE: it may own arrays again, and its home arrays with\n"+
				"failback auto return to it once they are redundant.",
			"wait until NODE is up, its home arrays (failback auto) are back on it and every array is optimal and active"
	}
	cmd := &cobra.Command{
		Use:   action + " NODE",
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(1),
		RunE:  func(cmd *cobra.Command, args []string) error { return runDrain(cmd, o, action, args[0]) },
	}
	o.AddFlags(cmd.Flags(), waitHelp)
	return cmd
}

// runDrain records the drain (or undrain) of node and with --wait waits
// until it is done.
func runDrain(cmd *cobra.Command, o *drainOptions, action, node string) error {
	c, err := o.cluster.connect()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	err = c.call(ctx, func(cl *api.Client) error {
		if o.drain {
			return cl.Drain(ctx, node)
		}
		return cl.Undrain(ctx, node)
	})
	if errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("%w; see `tier0 node list` for the nodes", err)
	}
	if err != nil {
		return err
	}
	res := moveResult{Node: node, Action: action, Result: "accepted"}
	w := cmd.OutOrStdout()
	if !o.cluster.root.json {
		fmt.Fprintf(w, "%s of node %s accepted\n", action, node)
	}
	if o.wait {
		pending := undrainPending
		if o.drain {
			pending = drainPending
		}
		if err := waitFor(ctx, c, cmd.ErrOrStderr(), o.cluster.root.poll, o.waitTimeout, func(s api.Status) []string { return pending(s, node) }); err != nil {
			return fmt.Errorf("%s of node %s was recorded, but %w", action, node, err)
		}
		res.Result = "done"
	}
	if o.cluster.root.json {
		return mgmtJSON(w, res)
	}
	switch {
	case o.wait && o.drain:
		fmt.Fprintf(w, "node %s owns no array now; it can be stopped (the arrays with a member on it run degraded meanwhile)\n", node)
	case o.wait:
		fmt.Fprintf(w, "node %s is back: every array is optimal\n", node)
	case o.drain:
		fmt.Fprintf(w, "its arrays move to other nodes in the background; watch with `tier0 status` or `tier0 events --follow`, or wait with --wait\n")
	default:
		fmt.Fprintf(w, "its home arrays return once redundant (failback auto); watch with `tier0 status`, or wait with --wait\n")
	}
	return nil
}

// drainPending lists what keeps a drain of node from being complete.
func drainPending(s api.Status, node string) []string {
	var out []string
	if i := slices.IndexFunc(s.Nodes, func(n cluster.NodeView) bool { return n.Name == node }); i < 0 {
		return []string{"node " + node + " is not in the cluster view"}
	} else if !s.Nodes[i].Draining {
		out = append(out, "node "+node+" not marked draining yet")
	}
	for _, a := range s.Arrays {
		switch {
		case a.Owner == node:
			out = append(out, fmt.Sprintf("array %s still on %s (phase %s)", a.Name, node, a.Phase))
		case a.Phase != "active" && a.Phase != "idle":
			out = append(out, fmt.Sprintf("array %s moving to %s (phase %s)", a.Name, orDash(a.Owner), a.Phase))
		}
	}
	return out
}

// undrainPending lists what keeps node from being fully back.
func undrainPending(s api.Status, node string) []string {
	var out []string
	i := slices.IndexFunc(s.Nodes, func(n cluster.NodeView) bool { return n.Name == node })
	if i < 0 {
		return []string{"node " + node + " is not in the cluster view"}
	}
	if n := s.Nodes[i]; n.State != cluster.NodeUp || n.Draining {
		out = append(out, fmt.Sprintf("node %s is %s, draining %s", node, n.State, yesNo(n.Draining)))
	}
	for _, a := range s.Arrays {
		switch {
		case a.Home == node && a.Policy != cluster.FailbackManual && a.Owner != node:
			out = append(out, fmt.Sprintf("array %s not back on its home %s (owner %s, phase %s)", a.Name, node, orDash(a.Owner), a.Phase))
		case a.State != cluster.StateOptimal || a.Phase != "active":
			st := fmt.Sprintf("array %s %s, phase %s", a.Name, a.State, a.Phase)
			for _, m := range a.Members {
				if inMotion(m) {
					st += fmt.Sprintf(", %s %s %d%%", m.Drive, m.State, m.Progress)
				}
			}
			out = append(out, st)
		}
	}
	return out
}

// waitFor polls the cluster view until pending returns nothing, printing
// what it still waits for whenever that changes. Unreachable nodes are
// retried (the node asked may be the one being restarted).
func waitFor(ctx context.Context, c *clusterConn, log io.Writer, poll, timeout time.Duration, pending func(api.Status) []string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(poll)
	defer t.Stop()
	last := ""
	for {
		s, err := c.status(ctx)
		var now string
		switch {
		case err == nil:
			p := pending(s)
			if len(p) == 0 {
				return nil
			}
			now = strings.Join(p, "; ")
		case errors.Is(err, api.ErrUnavailable) && ctx.Err() == nil:
			now = "cluster not answering: " + briefly(err)
		case ctx.Err() != nil:
		default:
			return err
		}
		if now != "" && now != last {
			fmt.Fprintln(log, "waiting: "+now)
			last = now
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("gave up after %s waiting for: %s (see `tier0 status`)", timeout, orDash(last))
			}
			return ctx.Err()
		case <-t.C:
		}
	}
}

func newNodeHealthCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "health [NODE]",
		Short: "Show one node's storage health as that node reports it (Slurm's input)",
		Long: "Ask NODE's own API (found in the site configuration) for its health:\n" +
			"daemon, lease, fencing, missing drives, and every array as seen from it.\n" +
			"Without NODE, the first node that answers reports on itself.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			get := func(ctx context.Context, c *clusterConn) (api.NodeHealth, error) {
				var h api.NodeHealth
				if len(args) == 1 {
					if err := c.Only(args[0]); err != nil {
						return h, err
					}
				}
				err := c.call(ctx, func(cl *api.Client) error {
					var err error
					h, err = cl.NodeHealth(ctx)
					return err
				})
				if err == nil && len(args) == 1 && h.Node != args[0] {
					err = fmt.Errorf("asked for node %s's health but %s answered; point --api at node %s's API", args[0], h.Node, args[0])
				}
				return h, err
			}
			return show(cmd, o, get, printHealth)
		},
	}
}

func printHealth(w io.Writer, h api.NodeHealth) error {
	fmt.Fprintf(w, "node %s: daemon %s, lease %s, fenced %s, drives missing %s, rebuild active %s, redundant %s\n\n",
		h.Node, h.Daemon, h.Lease, yesNo(h.Fenced), orDash(strings.Join(h.DrivesMissing, " ")), yesNo(h.RebuildActive), yesNo(h.Redundant))
	t := mgmtTable(w, "ARRAY", "STATE", "OWNER", "PATH USABLE")
	var rows [][]any
	for _, a := range h.Arrays {
		rows = append(rows, []any{a.Name, a.State, orDash(a.Owner), yesNo(a.PathUsable)})
	}
	return mgmtRender(t, rows)
}
