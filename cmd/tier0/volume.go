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
	"tier0/internal/units"
)

// newVolumeCmd is `tier0 volume create|resize|delete|list|show`
// (docs/VOLUMES.md).
func newVolumeCmd(root *rootOptions) *cobra.Command {
	vol := &cobra.Command{
		Use:   "volume",
		Short: "Carve volumes (namespaces) from pools (arrays), online",
		Long: "A volume is a namespace of its pool's subsystem, served by every node and\n" +
			"failing over with the pool. A pool serves one implicit volume spanning it (NSID\n" +
			"1, named after the array) until that is deleted with --force; then volumes are\n" +
			"carved from it. See docs/VOLUMES.md.",
	}
	o := newClusterGroup(root, vol)
	vol.AddCommand(newVolumeListCmd(o), newVolumeShowCmd(o), newVolumeCreateCmd(o), newVolumeResizeCmd(o), newVolumeHostsCmd(o), newVolumeDeleteCmd(o))
	return vol
}

func newVolumeListCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every volume: pool, NSID, size, state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			get := func(ctx context.Context, c *clusterConn) ([]api.Volume, error) {
				var vols []api.Volume
				err := c.call(ctx, func(cl *api.Client) error {
					var err error
					vols, err = cl.Volumes(ctx)
					return err
				})
				if vols == nil {
					vols = []api.Volume{}
				}
				return vols, volumeErr(err)
			}
			return show(cmd, o, get, printVolumes)
		},
	}
}

func printVolumes(w io.Writer, vols []api.Volume) error {
	t := mgmtTable(w, "VOLUME", "POOL", "NSID", "SIZE", "STATE", "NGUID")
	var rows [][]any
	for _, v := range vols {
		name := v.Name
		if v.Implicit {
			name += " (implicit)"
		}
		rows = append(rows, []any{name, v.Pool, v.NSID, units.FormatBytes(v.Size), v.State, v.NGUID})
	}
	return mgmtRender(t, rows)
}

func newVolumeShowCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME",
		Short: "Show one volume: extents, identifiers, the hosts that use it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			get := func(ctx context.Context, c *clusterConn) (api.Volume, error) {
				var v api.Volume
				err := c.call(ctx, func(cl *api.Client) error {
					var err error
					v, err = cl.Volume(ctx, args[0])
					return err
				})
				return v, volumeErr(err)
			}
			return show(cmd, o, get, printVolume)
		},
	}
}

func printVolume(w io.Writer, v api.Volume) error {
	fmt.Fprintf(w, "volume %s: pool %s, %s namespace %d, size %s (%d bytes), state %s\n", v.Name, v.Pool, v.SubNQN, v.NSID, units.FormatBytes(v.Size), v.Size, v.State)
	fmt.Fprintf(w, "  nguid %s, uuid %s\n", v.NGUID, v.UUID)
	if len(v.Hosts) > 0 {
		fmt.Fprintf(w, "  hosts: %s (no other host sees it)\n", strings.Join(v.Hosts, ", "))
	} else {
		fmt.Fprintln(w, "  hosts: every host the pool's subsystem admits")
	}
	for _, e := range v.Extents {
		fmt.Fprintf(w, "  extent: pool bytes %d +%d\n", e.Off, e.Len)
	}
	for _, e := range v.Pending {
		fmt.Fprintf(w, "  pending (being zeroed): pool bytes %d +%d\n", e.Off, e.Len)
	}
	if len(v.RemovedOn) > 0 {
		fmt.Fprintf(w, "  removed on: %s\n", strings.Join(v.RemovedOn, ", "))
	}
	for _, h := range v.Holders {
		fmt.Fprintf(w, "  used by %s\n", h)
	}
	return nil
}

// volumeErr explains a 404 of the volume endpoints themselves.
func volumeErr(err error) error {
	if err != nil && errors.Is(err, api.ErrNotFound) && strings.Contains(err.Error(), "no endpoint") {
		return fmt.Errorf("%w; the daemon answering is older than this tier0 (no volume endpoints)", err)
	}
	return err
}

// volumeCreateOptions are the flags of volume create.
type volumeCreateOptions struct {
	cluster *clusterOptions
	pool    string
	size    string
	hosts   []string
}

// allowHostUsage is the help of --allow-host.
const allowHostUsage = "a host NQN that may see and use the volume (repeat for several); with none every host the pool's subsystem admits does"

func (o *volumeCreateOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.pool, "pool", "", "the array to carve the volume from (required)")
	fs.StringVar(&o.size, "size", "", "the volume's size: 10GiB, 512M, ... (powers of 1024; required)")
	fs.StringArrayVar(&o.hosts, "allow-host", nil, allowHostUsage)
}

func newVolumeCreateCmd(co *clusterOptions) *cobra.Command {
	o := &volumeCreateOptions{cluster: co}
	cmd := &cobra.Command{
		Use:   "create NAME --pool ARRAY --size SIZE [--allow-host NQN]...",
		Short: "Create a thick volume; every node serves it once the pool's owner zeroed it",
		Long: "Allocate SIZE bytes of ARRAY (first fit) for a new volume with the next free\n" +
			"namespace ID and a new NGUID/UUID. The pool's owner zeroes the bytes, then\n" +
			"every node adds the namespace and connected hosts are told (rescan). The pool\n" +
			"must have been carved: `tier0 volume delete ARRAY --force` releases its implicit\n" +
			"whole-array volume once. With --allow-host only those hosts see the namespace\n" +
			"(on every node's path); others find no such NSID. Needs the API token.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return runVolumeCreate(cmd, o, args[0]) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runVolumeCreate(cmd *cobra.Command, o *volumeCreateOptions, name string) error {
	if o.pool == "" || o.size == "" {
		return fmt.Errorf("volume create %s: --pool ARRAY and --size SIZE are both needed (e.g. --pool a --size 10GiB)", name)
	}
	size, err := units.ParseBytes(o.size)
	if err != nil {
		return fmt.Errorf("--size: %w", err)
	}
	return mutateVolume(cmd, o.cluster, func(ctx context.Context, cl *api.Client) (api.Volume, error) {
		return cl.CreateVolume(ctx, name, o.pool, size, o.hosts...)
	}, "created; it is served once the pool's owner zeroed it (tier0 volume show "+name+")")
}

// volumeResizeOptions are the flags of volume resize.
type volumeResizeOptions struct {
	cluster *clusterOptions
	size    string
}

func (o *volumeResizeOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.size, "size", "", "the new size (volumes only grow; required)")
}

func newVolumeResizeCmd(co *clusterOptions) *cobra.Command {
	o := &volumeResizeOptions{cluster: co}
	cmd := &cobra.Command{
		Use:   "resize NAME --size SIZE",
		Short: "Grow a volume; hosts get the namespace-changed notice and see the new size",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.size == "" {
				return fmt.Errorf("volume resize %s: --size SIZE is needed (the new, larger size)", args[0])
			}
			size, err := units.ParseBytes(o.size)
			if err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			return mutateVolume(cmd, o.cluster, func(ctx context.Context, cl *api.Client) (api.Volume, error) {
				return cl.ResizeVolume(ctx, args[0], size)
			}, "growing; the hosts see the new size once the pool's owner zeroed the new bytes")
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// volumeHostsOptions are the flags of volume hosts.
type volumeHostsOptions struct {
	cluster *clusterOptions
	hosts   []string
	any     bool
}

func (o *volumeHostsOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.hosts, "allow-host", nil, "a host NQN that may see and use the volume (repeat for several); replaces the list")
	fs.BoolVar(&o.any, "any-host", false, "clear the list: every host the pool's subsystem admits sees the volume")
}

func newVolumeHostsCmd(co *clusterOptions) *cobra.Command {
	o := &volumeHostsOptions{cluster: co}
	cmd := &cobra.Command{
		Use:   "hosts NAME (--allow-host NQN... | --any-host)",
		Short: "Set which hosts see and may use a volume (on every node's path)",
		Long: "Replace the volume's host allow-list. A host not on a non-empty list does not\n" +
			"see the namespace (not in Identify's active namespace list) and its commands\n" +
			"to it fail with Invalid Namespace, through every node. Connected hosts are\n" +
			"told (namespace-attribute-changed) and rescan. Needs the API token.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.any == (len(o.hosts) > 0) {
				return fmt.Errorf("volume hosts %s: give either --allow-host NQN (one or more; the new list) or --any-host (every host), not both or neither", args[0])
			}
			return mutateVolume(cmd, o.cluster, func(ctx context.Context, cl *api.Client) (api.Volume, error) {
				return cl.SetVolumeHosts(ctx, args[0], o.hosts)
			}, "hosts set; every node applies them and connected hosts rescan")
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// volumeDeleteOptions are the flags of volume delete.
type volumeDeleteOptions struct {
	cluster *clusterOptions
	force   bool
}

func (o *volumeDeleteOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.force, "force", false, "delete even though hosts are connected or hold reservations (their I/O fails); needed for a pool's implicit volume")
}

func newVolumeDeleteCmd(co *clusterOptions) *cobra.Command {
	o := &volumeDeleteOptions{cluster: co}
	cmd := &cobra.Command{
		Use:   "delete NAME [--force]",
		Short: "Delete a volume from every node; its bytes are reused once all removed it",
		Long: "Every node removes the namespace; its extents and NSID are reused only after\n" +
			"every node has. A volume that hosts are connected to or hold a reservation on\n" +
			"is refused (the hosts and nodes are named) unless --force. Deleting a pool's\n" +
			"implicit volume (named after the array) always needs --force: all its data is\n" +
			"lost and the pool can then be carved into volumes. Needs the API token.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return mutateVolume(cmd, o.cluster, func(ctx context.Context, cl *api.Client) (api.Volume, error) {
				return cl.DeleteVolume(ctx, args[0], o.force)
			}, "deleting; every node removes its namespace")
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// mutateVolume runs one mutating volume call on the first node that
// answers and prints the volume (JSON with --json).
func mutateVolume(cmd *cobra.Command, o *clusterOptions, f func(context.Context, *api.Client) (api.Volume, error), what string) error {
	ctx := cmd.Context()
	c, err := o.connect()
	if err != nil {
		return err
	}
	var v api.Volume
	err = c.call(ctx, func(cl *api.Client) error {
		var err error
		v, err = f(ctx, cl)
		return err
	})
	if err != nil {
		return volumeErr(err)
	}
	if o.root.json {
		return mgmtJSON(cmd.OutOrStdout(), v)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "volume %s (pool %s, namespace %d): %s\n", v.Name, v.Pool, v.NSID, what)
	return printVolume(cmd.OutOrStdout(), v)
}
