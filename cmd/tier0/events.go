package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/api"
)

// eventsOptions are the flags of `tier0 events`.
type eventsOptions struct {
	cluster *clusterOptions
	follow  bool
	after   int64
	last    int
}

func (o *eventsOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVarP(&o.follow, "follow", "f", false, "keep printing new events until interrupted")
	fs.Int64Var(&o.after, "after", 0, "only events after this revision (the REV column)")
	fs.IntVar(&o.last, "last", 0, "only the last N events (0: all)")
}

// newEventsCmd is `tier0 events [--follow]`: the failover/event log.
func newEventsCmd(root *rootOptions) *cobra.Command {
	o := &eventsOptions{}
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Show the cluster's event log (failovers, hand-offs, drive and node events)",
		Long: "Show the event log kept in the cluster store, oldest first: node lost and\n" +
			"returned, failovers and planned hand-offs with their duration, members\n" +
			"failed, resynced and rebuilt, arrays failed (array-failed, with the reason)\n" +
			"and recovered (array-recovered), scrubs started and their findings\n" +
			"(scrub-done, scrub-failed). --follow keeps printing new events as they\n" +
			"are written (one line each; with --json one JSON object per line) until\n" +
			"interrupted.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runEvents(cmd, o) },
	}
	o.cluster = newClusterGroup(root, cmd)
	o.AddFlags(cmd.Flags())
	return cmd
}

func runEvents(cmd *cobra.Command, o *eventsOptions) error {
	c, err := o.cluster.connect()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	evs, err := fetchEvents(ctx, c, o.after)
	if err != nil {
		return err
	}
	if o.last > 0 && len(evs) > o.last {
		evs = evs[len(evs)-o.last:]
	}
	w := cmd.OutOrStdout()
	jsonOut := o.cluster.root.json
	if !o.follow {
		if jsonOut {
			return mgmtJSON(w, evs)
		}
		return printEvents(w, evs)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return followEvents(ctx, c, w, cmd.ErrOrStderr(), jsonOut, o.cluster.root.poll, evs, o.after)
}

func fetchEvents(ctx context.Context, c *clusterConn, after int64) ([]api.Event, error) {
	var evs []api.Event
	err := c.call(ctx, func(cl *api.Client) error {
		var err error
		evs, err = cl.Events(ctx, after, 0)
		return err
	})
	if evs == nil {
		evs = []api.Event{}
	}
	return evs, err
}

func eventsTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// eventMove: "B->A" for a move, "->A" for a first assignment, else "".
func eventMove(e api.Event) string {
	if e.From == "" && e.To == "" {
		return ""
	}
	return e.From + "->" + e.To
}

func eventFields(e api.Event) []any {
	epoch, dur := "", ""
	if e.Epoch > 0 {
		epoch = strconv.FormatUint(e.Epoch, 10)
	}
	if e.Duration > 0 {
		dur = strconv.FormatFloat(e.Duration, 'f', 3, 64) + "s"
	}
	return []any{e.Revision, eventsTime(e.Time), e.Kind, orDash(e.Array), orDash(e.Node), orDash(eventMove(e)), orDash(epoch), orDash(dur), e.Message}
}

func printEvents(w io.Writer, evs []api.Event) error {
	t := mgmtTable(w, "REV", "TIME", "KIND", "ARRAY", "NODE", "MOVE", "EPOCH", "TOOK", "MESSAGE")
	var rows [][]any
	for _, e := range evs {
		rows = append(rows, eventFields(e))
	}
	return mgmtRender(t, rows)
}

// eventLine is one event as a line for --follow.
func eventLine(e api.Event) string {
	f := eventFields(e)
	parts := []string{fmt.Sprintf("%-6d", e.Revision), f[1].(string), fmt.Sprintf("%-16s", e.Kind)}
	for i, k := range []string{"array", "node", "move", "epoch", "took"} {
		if v := f[3+i].(string); v != "-" {
			parts = append(parts, k+"="+v)
		}
	}
	if e.Message != "" {
		parts = append(parts, strconv.Quote(e.Message))
	}
	return strings.Join(parts, " ")
}

// followEvents prints evs and then every new event until ctx ends. A node
// that stops answering is replaced by the next one (the log is the
// cluster's, so revisions continue).
func followEvents(ctx context.Context, c *clusterConn, w, log io.Writer, jsonOut bool, poll time.Duration, evs []api.Event, after int64) error {
	emit := func(e api.Event) error {
		if jsonOut {
			return writeJSONLine(w, e)
		}
		_, err := fmt.Fprintln(w, eventLine(e))
		return err
	}
	for _, e := range evs {
		if err := emit(e); err != nil {
			return err
		}
		after = max(after, e.Revision)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	down := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		evs, err := fetchEvents(ctx, c, after)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, api.ErrUnavailable):
			if !down {
				fmt.Fprintln(log, "tier0 events: cluster not answering, retrying: "+briefly(err))
				down = true
			}
			continue
		case err != nil:
			return err
		}
		if down {
			fmt.Fprintln(log, "tier0 events: cluster answering again")
			down = false
		}
		for _, e := range evs {
			if e.Revision <= after {
				continue
			}
			if err := emit(e); err != nil {
				return err
			}
			after = e.Revision
		}
	}
}

// writeJSONLine writes v as one line of JSON (JSON Lines).
func writeJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}
