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

	"tier0/daemon/api"
	"tier0/daemon/cluster"
)

// `tier0 node list|drain|undrain|health`.
func init() {
	nodeCmd := addClusterFlags(&cobra.Command{
		Use:   "node",
		Short: "List nodes, drain a node for maintenance and undrain it, show a node's health",
	})
	nodeCmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List every node: failure domain, state, draining, drives, arrays owned",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			s, err := c.status(cmd.Context())
			if err != nil {
				return err
			}
			if jsonOut {
				if s.Nodes == nil {
					s.Nodes = []cluster.NodeView{}
				}
				return mgmtJSON(cmd.OutOrStdout(), s.Nodes)
			}
			return printNodes(cmd.OutOrStdout(), s.Nodes)
		},
	})
	nodeCmd.AddCommand(drainCmd(true), drainCmd(false), nodeHealthCmd())
	rootCmd.AddCommand(nodeCmd)
}

// moveResult is the JSON answer of drain and undrain.
type moveResult struct {
	Node   string `json:"node"`
	Action string `json:"action"` // drain, undrain
	// Result is "accepted" (recorded; the move goes on in the background)
	// or, with --wait, "done".
	Result string `json:"result"`
}

func drainCmd(drain bool) *cobra.Command {
	var wait bool
	var waitTimeout time.Duration
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
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			c, err := connect()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			err = c.call(ctx, func(cl *api.Client) error {
				if drain {
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
			if !jsonOut {
				fmt.Fprintf(w, "%s of node %s accepted\n", action, node)
			}
			if wait {
				pending := undrainPending
				if drain {
					pending = drainPending
				}
				if err := waitFor(ctx, c, cmd.ErrOrStderr(), waitTimeout, func(s api.Status) []string { return pending(s, node) }); err != nil {
					return fmt.Errorf("%s of node %s was recorded, but %w", action, node, err)
				}
				res.Result = "done"
			}
			if jsonOut {
				return mgmtJSON(w, res)
			}
			switch {
			case wait && drain:
				fmt.Fprintf(w, "node %s owns no array now; it can be stopped (the arrays with a member on it run degraded meanwhile)\n", node)
			case wait:
				fmt.Fprintf(w, "node %s is back: every array is optimal\n", node)
			case drain:
				fmt.Fprintf(w, "its arrays move to other nodes in the background; watch with `tier0 status` or `tier0 events --follow`, or wait with --wait\n")
			default:
				fmt.Fprintf(w, "its home arrays return once redundant (failback auto); watch with `tier0 status`, or wait with --wait\n")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, waitHelp)
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", 30*time.Minute, "give up waiting after this long (exit 1)")
	return cmd
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
func waitFor(ctx context.Context, c *clusterConn, log io.Writer, timeout time.Duration, pending func(api.Status) []string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(mgmtPoll)
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

func nodeHealthCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "health [NODE]",
		Short: "Show one node's storage health as that node reports it (Slurm's input)",
		Long: "Ask NODE's own API (found in the site configuration) for its health:\n" +
			"daemon, lease, fencing, missing drives, and every array as seen from it.\n" +
			"Without NODE, the first node that answers reports on itself.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := connect()
			if err != nil {
				return err
			}
			if len(args) == 1 {
				if err := c.only(args[0]); err != nil {
					return err
				}
			}
			var h api.NodeHealth
			err = c.call(cmd.Context(), func(cl *api.Client) error {
				h, err = cl.NodeHealth(cmd.Context())
				return err
			})
			if err != nil {
				return err
			}
			if len(args) == 1 && h.Node != args[0] {
				return fmt.Errorf("asked for node %s's health but %s answered; point --api at node %s's API", args[0], h.Node, args[0])
			}
			if jsonOut {
				return mgmtJSON(cmd.OutOrStdout(), h)
			}
			return printHealth(cmd.OutOrStdout(), h)
		},
	}
}

// only narrows the connection to node's endpoint (site configurations
// name their nodes; with --api the answer is checked instead).
func (c *clusterConn) only(node string) error {
	var names []string
	for _, ep := range c.eps {
		if ep.node == node {
			c.eps = []endpoint{ep}
			return nil
		}
		names = append(names, ep.node)
	}
	if len(c.eps) == 1 && c.eps[0].node == "" {
		return nil
	}
	return fmt.Errorf("node %q is not in %s; its nodes are %s", node, c.source, strings.Join(names, ", "))
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
