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

// arrayCreateOptions are the flags of array create.
type arrayCreateOptions struct {
	cluster  *clusterOptions
	level    string
	home     string
	members  int
	chunk    int
	noVolume bool
}

func (o *arrayCreateOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.level, "level", "raid5", "RAID level: raid5 or raid6")
	fs.IntVar(&o.members, "members", 0, "member count: drives no array uses, on distinct nodes other than the home (required)")
	fs.StringVar(&o.home, "home", "", "node that owns the array when healthy (default: the node homing the fewest arrays)")
	fs.IntVar(&o.chunk, "chunk-kib", 0, "chunk size in KiB, a power of two 4..4096 (default 128)")
	fs.BoolVar(&o.noVolume, "no-volume", false, "start with no volume (carve it with `tier0 volume create`) instead of one volume spanning the array")
}

func newArrayCreateCmd(co *clusterOptions) *cobra.Command {
	o := &arrayCreateOptions{cluster: co}
	cmd := &cobra.Command{
		Use:   "create NAME --members N [--level raid5|raid6] [--home NODE] [--chunk-kib K] [--no-volume]",
		Short: "Create an array online on free drives (no restart, no site-file edit)",
		Long: "Create array NAME on the running cluster: N drives that no array uses, on\n" +
			"distinct nodes other than its home and across failure domains as the site's\n" +
			"placement.domains says (the site file's placement rules). The desired state\n" +
			"goes to the control plane; every node serves the array's subsystem, and its\n" +
			"home assembles it (superblocks written on the members) and serves it\n" +
			"optimized; it fails over like any array. Like a site-file array it starts\n" +
			"with one volume spanning it, named after it (--no-volume: none; carve\n" +
			"volumes with `tier0 volume create`). `tier0 config export` includes it.\n" +
			"Follow it with `tier0 array show NAME`. Needs the API token.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.members == 0 {
				return fmt.Errorf("--members N is required: the number of drives of array %s (raid5: 3 or more, raid6: 4 or more)", args[0])
			}
			req := api.ArrayCreate{Name: args[0], Level: o.level, Members: o.members, Home: o.home, ChunkKiB: o.chunk, NoVolume: o.noVolume}
			return mutateArray(cmd, o.cluster, func(ctx context.Context, cl *api.Client) (api.OnlineArray, error) {
				return cl.CreateArray(ctx, req)
			})
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func newArrayDeleteCmd(co *clusterOptions) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "delete NAME [--force]",
		Short: "Delete an array created online; its drives are wiped and free again",
		Long: "Delete array NAME (one created with `tier0 array create`; a site-file\n" +
			"array is removed from the site file). Refused while the pool has volumes\n" +
			"(its spanning volume included) or hosts are connected to or hold\n" +
			"reservations on it, naming them; --force deletes anyway: its volumes and\n" +
			"their data are gone, hosts see the namespaces removed. Every node stops\n" +
			"serving it, then the member drives' superblocks are wiped so that the drives\n" +
			"are free for a new array. Needs the API token.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return mutateArray(cmd, co, func(ctx context.Context, cl *api.Client) (api.OnlineArray, error) {
				return cl.DeleteArray(ctx, args[0], force)
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete even with volumes or hosts using it (their data is lost)")
	return cmd
}

// mutateArray runs one array create or delete on the first node that
// answers and prints the result (JSON with --json).
func mutateArray(cmd *cobra.Command, o *clusterOptions, f func(context.Context, *api.Client) (api.OnlineArray, error)) error {
	ctx := cmd.Context()
	c, err := o.connect()
	if err != nil {
		return err
	}
	var a api.OnlineArray
	err = c.call(ctx, func(cl *api.Client) error {
		var err error
		a, err = f(ctx, cl)
		return err
	})
	if err != nil && errors.Is(err, api.ErrNotFound) && strings.Contains(err.Error(), "no endpoint") {
		return fmt.Errorf("%w; the daemon answering is older than this tier0 (no online array endpoints)", err)
	}
	if err != nil {
		return err
	}
	if o.root.json {
		return mgmtJSON(cmd.OutOrStdout(), a)
	}
	return printOnlineArray(cmd.OutOrStdout(), a)
}

func printOnlineArray(w io.Writer, a api.OnlineArray) error {
	switch a.Phase {
	case "active":
		fmt.Fprintf(w, "array %s created: %s, chunk %d KiB, home %s, members %s\n", a.Name, a.Level, a.ChunkKiB, a.Home, strings.Join(a.Members, " "))
		fmt.Fprintf(w, "every node serves it; its home assembles it: `tier0 array show %s`\n", a.Name)
	case "deleted":
		fmt.Fprintf(w, "array %s deleted; drives %s are free\n", a.Name, strings.Join(a.Members, " "))
	case "deleting":
		if len(a.Unwiped) == 0 {
			fmt.Fprintf(w, "array %s deleting: stopped on %s, wiped on %s; run the delete again to follow it\n", a.Name, orDash(strings.Join(a.Stopped, " ")), orDash(strings.Join(a.Wiped, " ")))
			break
		}
		fmt.Fprintf(w, "array %s deleted from every live node; %s keep its superblock until their node returns and wipes them: until then those drives and the name %s stay taken (start the node; `tier0 array delete %s` again shows it)\n",
			a.Name, strings.Join(a.Unwiped, ", "), a.Name, a.Name)
	default:
		fmt.Fprintf(w, "array %s %s: stopped on %s, wiped on %s; run the delete again to follow it\n", a.Name, a.Phase, orDash(strings.Join(a.Stopped, " ")), orDash(strings.Join(a.Wiped, " ")))
	}
	if len(a.Volumes) > 0 {
		fmt.Fprintf(w, "volumes removed: %s\n", strings.Join(a.Volumes, ", "))
	}
	for _, h := range a.Holders {
		fmt.Fprintf(w, "was in use by: %s\n", h)
	}
	return nil
}
