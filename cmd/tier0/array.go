package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/api"
	"tier0/daemon/config"
)

// newArrayCmd is `tier0 array list|show|scrub|create|delete`.
func newArrayCmd(root *rootOptions) *cobra.Command {
	arr := &cobra.Command{
		Use:   "array",
		Short: "List and show arrays; explain how to create or delete one",
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

// unsupportedError: the request is not done through the API in this
// release; what to do instead was printed. Exit status 2.
type unsupportedError struct{ msg string }

func (e unsupportedError) Error() string { return e.msg }
func (unsupportedError) ExitCode() int   { return exitUnsupported }

// arrayPlan is what array create/delete print: the site-config edit that
// does what was asked, and the problems with it.
type arrayPlan struct {
	Action    string   `json:"action"` // create, delete
	Array     string   `json:"array"`
	Supported bool     `json:"supported"` // always false in this release
	Site      string   `json:"site,omitempty"`
	Entry     string   `json:"entry,omitempty"`  // the arrays: entry to add or remove
	Freeze    []string `json:"freeze,omitempty"` // automatic arrays to write out first
	Steps     []string `json:"steps"`
	Problems  []string `json:"problems"`
}

// planSite is the site configuration array create/delete check against:
// --site, $TIER0_SITE, or the default file when it exists; "" when none.
func (o *clusterOptions) planSite() string {
	for _, s := range []string{o.site, os.Getenv("TIER0_SITE")} {
		if s != "" {
			return s
		}
	}
	if _, err := os.Stat(defaultSiteFile); err == nil {
		return defaultSiteFile
	}
	return ""
}

// arrayEntry formats one arrays: entry in the flow style of the shipped
// site configurations.
func arrayEntry(a config.Array) string {
	var b strings.Builder
	fmt.Fprintf(&b, "- {name: %s, level: %s", a.Name, a.Level)
	if a.ChunkKiB != 0 {
		fmt.Fprintf(&b, ", chunk_kib: %d", a.ChunkKiB)
	}
	fmt.Fprintf(&b, ", home: %s, ", a.Home)
	if len(a.Members) == 0 {
		b.WriteString("members: auto")
		if a.Width > 0 {
			fmt.Fprintf(&b, ", width: %d", a.Width)
		}
	} else {
		b.WriteString("members: [" + strings.Join(a.Members, ", ") + "]")
	}
	b.WriteString("}")
	return b.String()
}

// freezeAuto lists the automatic arrays of c (other than skip) as entries
// with their resolved members: placement is computed over all automatic
// arrays together, so adding or removing one may move the others' members
// (and so their data) unless they are written out first.
func freezeAuto(c *config.Config, skip string) []string {
	var out []string
	for _, a := range c.Arrays {
		if a.Auto && a.Name != skip {
			out = append(out, arrayEntry(a))
		}
	}
	return out
}

var rollingSteps = []string{
	"copy the edited file to every node (it must be identical everywhere)",
	"restart tier0d one node at a time, waiting for every array to be optimal before the next (docs/OPERATIONS.md, \"Rolling restart\"); the coordinator reads the arrays when it starts",
}

func printPlan(cmd *cobra.Command, jsonOut bool, p arrayPlan) error {
	if p.Problems == nil {
		p.Problems = []string{}
	}
	if jsonOut {
		if err := mgmtJSON(cmd.OutOrStdout(), p); err != nil {
			return err
		}
	} else {
		w := cmd.OutOrStdout()
		site := p.Site
		if site == "" {
			site = "the site configuration (" + defaultSiteFile + ")"
		}
		fmt.Fprintf(w, "tier0 array %s: in this release arrays are defined in the site configuration; the management API cannot %s them.\n", p.Action, p.Action)
		if len(p.Problems) > 0 {
			fmt.Fprintf(w, "\nThe %s as asked would be wrong:\n", p.Action)
			for _, pr := range p.Problems {
				fmt.Fprintln(w, "  - "+pr)
			}
		}
		fmt.Fprintf(w, "\nTo %s array %s:\n", p.Action, p.Array)
		n := 1
		if len(p.Freeze) > 0 {
			fmt.Fprintf(w, "  %d. in %s, write out the members of the automatically placed arrays, so that they stay where their data is:\n", n, site)
			for _, l := range p.Freeze {
				fmt.Fprintln(w, "       "+l)
			}
			n++
		}
		if p.Action == "create" {
			fmt.Fprintf(w, "  %d. add to the arrays: list of %s:\n       %s\n", n, site, p.Entry)
		} else {
			fmt.Fprintf(w, "  %d. remove this entry from the arrays: list of %s:\n       %s\n", n, site, orDash(p.Entry))
		}
		n++
		for _, s := range p.Steps {
			fmt.Fprintf(w, "  %d. %s\n", n, s)
			n++
		}
	}
	if len(p.Problems) > 0 {
		return fmt.Errorf("array %s %s: %d problem(s), listed above", p.Action, p.Array, len(p.Problems))
	}
	return unsupportedError{fmt.Sprintf("array %s is done by editing the site configuration in this release (steps above)", p.Action)}
}

// arrayCreateOptions are the flags of array create.
type arrayCreateOptions struct {
	cluster              *clusterOptions
	level, home, members string
	width, chunk         int
}

func (o *arrayCreateOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.level, "level", "raid5", "RAID level: raid5 or raid6")
	fs.StringVar(&o.home, "home", "", "node that owns the array when it is healthy (required)")
	fs.StringVar(&o.members, "members", "auto", "drive names in RAID order, comma separated, or auto")
	fs.IntVar(&o.width, "width", 0, "member count for --members auto (default: nodes-1)")
	fs.IntVar(&o.chunk, "chunk-kib", 0, "chunk size in KiB, a power of two 4..4096 (default 128)")
}

func newArrayCreateCmd(co *clusterOptions) *cobra.Command {
	o := &arrayCreateOptions{cluster: co}
	cmd := &cobra.Command{
		Use:   "create NAME --home NODE [--level raid5|raid6] [--members auto|D1,D2,...] [--width N] [--chunk-kib K]",
		Short: "Print the site-configuration change that creates an array (exit 2)",
		Long: "Arrays are defined in the site configuration in this release; the management\n" +
			"API cannot create them. This verb prints the entry to add and the steps to\n" +
			"roll it out, and with a site configuration (--site, $TIER0_SITE or\n" +
			defaultSiteFile + ") checks it: placement resolved, drives not shared with\n" +
			"other arrays. Exit status 2 when the plan is sound, 1 when it is not.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runArrayCreate(cmd, o, args[0]) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// runArrayCreate prints (and with a site configuration checks) the plan
// that creates array name.
func runArrayCreate(cmd *cobra.Command, o *arrayCreateOptions, name string) error {
	if o.home == "" {
		return fmt.Errorf("--home NODE is required: the node that owns array %s when it is healthy", name)
	}
	a := config.Array{Name: name, Level: o.level, Home: o.home, ChunkKiB: o.chunk, Width: o.width}
	if o.members != "" && o.members != "auto" {
		for _, m := range strings.Split(o.members, ",") {
			a.Members = append(a.Members, strings.TrimSpace(m))
		}
	} else {
		a.Auto = true
	}
	p := arrayPlan{Action: "create", Array: a.Name, Site: o.cluster.planSite(), Steps: append([]string{"check it: tier0 config validate SITE && tier0 config placement SITE"}, rollingSteps...)}
	if p.Site == "" {
		p.Entry = arrayEntry(a)
		p.Problems = []string{} // nothing to check against
		return printPlan(cmd, o.cluster.root.json, p)
	}
	c, err := mgmtLoadSite(p.Site)
	if err != nil {
		return err
	}
	p.Steps[0] = strings.ReplaceAll(p.Steps[0], "SITE", p.Site)
	p.Freeze = freezeAuto(c, "")
	cand := a // with the defaults Load would fill in
	cand.Level = strings.ToLower(cand.Level)
	if cand.ChunkKiB == 0 {
		cand.ChunkKiB = config.DefaultChunkKiB
	}
	if cand.Width == 0 {
		cand.Width = len(cand.Members)
		if cand.Auto {
			cand.Width = len(c.Nodes) - 1
		}
	}
	next := *c
	next.Arrays = append(slices.Clone(c.Arrays), cand)
	var ve *config.ValidationError
	if err := next.Validate(); errors.As(err, &ve) {
		for _, pr := range ve.Problems {
			p.Problems = append(p.Problems, pr.String())
		}
	} else if err != nil {
		return err
	}
	placed := next.Arrays[len(next.Arrays)-1]
	placed.ChunkKiB, placed.Width = o.chunk, o.width
	for _, d := range placed.Members {
		if users := c.DriveShares(d); len(users) > 0 {
			p.Problems = append(p.Problems, fmt.Sprintf(
				"drive %s already holds array(s) %s: a shared drive is split into equal extents, so adding %s would move their data; use drives no array uses (tier0 config placement %s lists the used ones)",
				d, strings.Join(users, ", "), a.Name, p.Site))
		}
	}
	p.Entry = arrayEntry(placed)
	return printPlan(cmd, o.cluster.root.json, p)
}

func newArrayDeleteCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Print the site-configuration change that deletes an array (exit 2)",
		Long: "Arrays are defined in the site configuration in this release; the management\n" +
			"API cannot delete them. This verb prints the steps, and with a site\n" +
			"configuration checks that deleting the array moves no other array's data.\n" +
			"Exit status 2 when the plan is sound, 1 when it is not.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			p := arrayPlan{Action: "delete", Array: name, Site: o.planSite()}
			nqn := "the array's subsystem NQN"
			var c *config.Config
			if p.Site != "" {
				var err error
				if c, err = mgmtLoadSite(p.Site); err != nil {
					return err
				}
				nqn = c.SubsystemNQN(name)
			}
			p.Steps = []string{
				"the array's data is lost to hosts: stop every user of it first (unmount; `nvme disconnect -n " + nqn + "` on every host)",
				"check the change: tier0 config validate SITE",
			}
			p.Steps = append(p.Steps, rollingSteps...)
			p.Steps = append(p.Steps, "its drives are then unused; their contents are not erased")
			if c == nil {
				return printPlan(cmd, o.root.json, p)
			}
			p.Steps[1] = strings.ReplaceAll(p.Steps[1], "SITE", p.Site)
			a, ok := c.Array(name)
			if !ok {
				var names []string
				for _, a := range c.Arrays {
					names = append(names, a.Name)
				}
				return fmt.Errorf("array %q is not defined in %s; the arrays there are: %s", name, p.Site, strings.Join(names, ", "))
			}
			p.Entry = arrayEntry(*a)
			if a.Auto {
				// The entry as written in the file.
				p.Entry = arrayEntry(config.Array{Name: a.Name, Level: a.Level, ChunkKiB: a.ChunkKiB, Home: a.Home, Width: a.Width})
			}
			p.Freeze = freezeAuto(c, name)
			for _, d := range a.Members {
				if users := c.DriveShares(d); len(users) > 1 {
					p.Problems = append(p.Problems, fmt.Sprintf(
						"drive %s is shared by arrays %s: its extents are assigned in the order of the arrays: list, so deleting %s would move the others' data; in this release an array can be deleted only when its drives hold no other array",
						d, strings.Join(users, ", "), name))
				}
			}
			return printPlan(cmd, o.root.json, p)
		},
	}
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
