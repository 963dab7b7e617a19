package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/api"
)

// newArrayCmd is `tier0 array list|show|scrub|create|delete`
// (create and delete: array_online.go).
func newArrayCmd(root *rootOptions) *cobra.Command {
	arr := &cobra.Command{
		Use:   "array",
		Short: "List, show, scrub arrays; create and delete them online",
	}
	o := newClusterGroup(root, arr)
	arr.AddCommand(newArrayListCmd(o), newArrayShowCmd(o), newArrayCreateCmd(o), newArrayDeleteCmd(o), newArrayScrubCmd(o))
	return arr
}

func newArrayListCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every array: level, home, owner, epoch, state, phase, members",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			get := func(ctx context.Context, c *clusterConn) ([]api.Array, error) {
				var arrays []api.Array
				err := c.call(ctx, func(cl *api.Client) error {
					var err error
					arrays, err = cl.Arrays(ctx)
					return err
				})
				if arrays == nil {
					arrays = []api.Array{}
				}
				return arrays, err
			}
			return show(cmd, o, get, printArrayList)
		},
	}
}

// printArrayList is the table of arrays and the members in motion.
func printArrayList(w io.Writer, arrays []api.Array) error {
	if err := printArrays(w, arrays); err != nil {
		return err
	}
	if rb := rebuildLines(arrays); len(rb) > 0 {
		fmt.Fprintln(w, "\nresync/rebuild:")
		for _, l := range rb {
			fmt.Fprintln(w, "  "+l)
		}
	}
	return nil
}

func newArrayShowCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Show one array and the state and rebuild progress of each member",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			get := func(ctx context.Context, c *clusterConn) (api.Array, error) {
				a, err := getArray(ctx, c, args[0])
				if errors.Is(err, api.ErrNotFound) {
					return a, arrayNotFound(ctx, c, args[0], err)
				}
				return a, err
			}
			return show(cmd, o, get, printArray)
		},
	}
}

// getArray is GET /v1/arrays/NAME from the first node that answers.
func getArray(ctx context.Context, c *clusterConn, name string) (api.Array, error) {
	var a api.Array
	err := c.call(ctx, func(cl *api.Client) error {
		var err error
		a, err = cl.Array(ctx, name)
		return err
	})
	return a, err
}

// arrayNotFound names the arrays that do exist.
func arrayNotFound(ctx context.Context, c *clusterConn, name string, err error) error {
	var arrays []api.Array
	if c.call(ctx, func(cl *api.Client) error {
		var e error
		arrays, e = cl.Arrays(ctx)
		return e
	}) != nil {
		return fmt.Errorf("array %q: %w; see `tier0 array list`", name, err)
	}
	names := make([]string, len(arrays))
	for i, a := range arrays {
		names[i] = a.Name
	}
	return fmt.Errorf("array %q does not exist (%w); the arrays are: %s", name, api.ErrNotFound, strings.Join(names, ", "))
}

func printArray(w io.Writer, a api.Array) error {
	fmt.Fprintf(w, "array %s: %s, home %s, owner %s, epoch %d, state %s, phase %s, failback %s\n",
		a.Name, a.Level, a.Home, orDash(a.Owner), a.Epoch, a.State, a.Phase, orDash(string(a.Policy)))
	for _, l := range problemLines([]api.Array{a}, nil) {
		fmt.Fprintln(w, "  "+l)
	}
	fmt.Fprintln(w)
	t := mgmtTable(w, "#", "DRIVE", "NODE", "STATE", "PROGRESS")
	var rows [][]any
	for i, m := range a.Members {
		prog := "-"
		if inMotion(m) {
			prog = rebuildBar(m.Progress)
		}
		rows = append(rows, []any{i, m.Drive, m.Node, string(m.State), prog})
	}
	return mgmtRender(t, rows)
}

// scrubResult is the JSON answer of array scrub.
type scrubResult struct {
	Array  string `json:"array"`
	Action string `json:"action"` // scrub
	Repair bool   `json:"repair"`
	Owner  string `json:"owner"`
	Result string `json:"result"` // accepted
}

// arrayScrubOptions are the flags of array scrub.
type arrayScrubOptions struct {
	cluster *clusterOptions
	repair  bool
}

func (o *arrayScrubOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.repair, "repair", false, "fix the parity mismatches found")
}

func newArrayScrubCmd(co *clusterOptions) *cobra.Command {
	o := &arrayScrubOptions{cluster: co}
	cmd := &cobra.Command{
		Use:   "scrub NAME",
		Short: "Check every stripe's parity of an array now (its owner reads the whole array)",
		Long: "Ask the owner of array NAME to scrub it: read every stripe and check its\n" +
			"parity (or mirrors), so that latent bad blocks are found while the array still\n" +
			"has its redundancy. With --repair, mismatches are fixed (RAID-5 rewrites\n" +
			"parity; RAID-6 repairs a located bad chunk). The scrub runs in the background\n" +
			"at the rebuild rate; its findings appear in `tier0 status` (scrub section),\n" +
			"`tier0 events` (scrub-done) and the tier0_scrub_* metrics. Sites can scrub\n" +
			"periodically with policies.scrub_interval. Needs the API token.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runArrayScrub(cmd, o, args[0]) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// runArrayScrub asks the owner of array name to scrub it.
func runArrayScrub(cmd *cobra.Command, o *arrayScrubOptions, name string) error {
	ctx := cmd.Context()
	c, err := o.cluster.connect()
	if err != nil {
		return err
	}
	a, err := getArray(ctx, c, name)
	if errors.Is(err, api.ErrNotFound) {
		return arrayNotFound(ctx, c, name, err)
	}
	if err != nil {
		return err
	}
	err = c.call(ctx, func(cl *api.Client) error { return cl.ScrubArray(ctx, name, o.repair) })
	if errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("%w; the daemon answering may be older than this tier0 (no scrub endpoint), or see `tier0 array list`", err)
	}
	if err != nil {
		return err
	}
	res := scrubResult{Array: name, Action: "scrub", Repair: o.repair, Owner: a.Owner, Result: "accepted"}
	if o.cluster.root.json {
		return mgmtJSON(cmd.OutOrStdout(), res)
	}
	w := cmd.OutOrStdout()
	what := "checks"
	if o.repair {
		what = "checks and repairs"
	}
	fmt.Fprintf(w, "scrub of array %s accepted: its owner %s %s every stripe in the background\n", name, orDash(a.Owner), what)
	fmt.Fprintln(w, "findings: `tier0 status` (scrub section) and `tier0 events`")
	return nil
}
