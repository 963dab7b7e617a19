package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/api"
	"tier0/daemon/config"
)

// configExportOptions are the flags of config export.
type configExportOptions struct {
	cluster *clusterOptions
	out     string
}

func (o *configExportOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.out, "output", "o", "", "write the site file here (default: standard output)")
}

// newConfigExportCmd is `tier0 config export`: the site file of the live
// cluster.
func newConfigExportCmd(root *rootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export [-o FILE]",
		Short: "Write a site file from the live cluster: nodes, fabrics, arrays with their members, volumes",
		Long: "Read the running configuration, the arrays' current members and the volumes\n" +
			"from the cluster's API and write them as a site file that `tier0 config\n" +
			"validate` and tier0d accept and that loads to the same desired state:\n" +
			"defaults spelled out, automatic placement frozen as the drives the arrays hold\n" +
			"now (after replacements), each carved volume with its NSID, identifiers, hosts\n" +
			"and extents. Secrets are written only as the file: references they are; an\n" +
			"inline secret is refused. See docs/CONFIG.md.",
		Args: cobra.NoArgs,
	}
	o := &configExportOptions{cluster: newClusterGroup(root, cmd)}
	o.AddFlags(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return runConfigExport(cmd, o) }
	return cmd
}

func runConfigExport(cmd *cobra.Command, o *configExportOptions) error {
	ctx := cmd.Context()
	c, err := o.cluster.connect()
	if err != nil {
		return err
	}
	var sc api.SiteConfig
	var arrays []api.Array
	var vols []api.Volume
	err = c.call(ctx, func(cl *api.Client) error {
		var err error
		if sc, err = cl.SiteConfig(ctx); err != nil {
			return err
		}
		if arrays, err = cl.Arrays(ctx); err != nil {
			return err
		}
		vols, err = cl.Volumes(ctx)
		return err
	})
	if errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("%w; the daemon answering may be older than this tier0 (no /v1/config endpoint)", err)
	}
	if err != nil {
		return err
	}
	cfg, skipped, err := liveConfig(sc, arrays, vols)
	if err != nil {
		return err
	}
	out, err := cfg.Export()
	if err != nil {
		return err
	}
	name := o.out
	if name == "" {
		name = "the export"
	}
	if _, err := config.Parse(name, out); err != nil {
		return fmt.Errorf("the exported site file does not validate (a bug; please report it with this output): %w", err)
	}
	for _, s := range skipped {
		fmt.Fprintln(cmd.ErrOrStderr(), "tier0 config export: "+s)
	}
	if o.out == "" {
		_, err = cmd.OutOrStdout().Write(out)
		return err
	}
	if err := os.WriteFile(o.out, out, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s: cluster %s, %d nodes, %d arrays, %d volumes\n", o.out, cfg.Cluster, len(cfg.Nodes), len(cfg.Arrays), len(cfg.Volumes))
	return nil
}

// liveConfig is the running configuration with the arrays' current
// members and the carved volumes (ready or growing, at their current
// extents); skipped says which volumes were left out and why.
func liveConfig(sc api.SiteConfig, arrays []api.Array, vols []api.Volume) (*config.Config, []string, error) {
	cfg := sc.Config
	cfg.File = ""
	for key, ref := range sc.Secrets {
		if ref == "inline" {
			return nil, nil, fmt.Errorf("%s is written inline in the running site file; export does not copy secrets: move it to a file (%s: file:/etc/tier0/...) on every node and export again", key, key)
		}
		f := &cfg.Fabrics.Backend
		if strings.HasPrefix(key, "fabrics.frontend.") {
			f = &cfg.Fabrics.Frontend
		}
		if strings.HasSuffix(key, ".dhchap_ctrl_secret") {
			f.DHCHAPCtrlSecret = ref
		} else {
			f.DHCHAPSecret = ref
		}
	}
	live := map[string]api.Array{}
	for _, a := range arrays {
		live[a.Name] = a
	}
	for i := range cfg.Arrays {
		a := &cfg.Arrays[i]
		if l, ok := live[a.Name]; ok && len(l.Members) > 0 {
			a.Members = a.Members[:0:0]
			for _, m := range l.Members {
				a.Members = append(a.Members, m.Drive)
			}
		}
		a.Auto, a.RawMembers, a.Width = false, nil, len(a.Members)
	}
	var skipped []string
	cfg.Volumes = nil
	for _, v := range vols {
		if v.Implicit {
			continue
		}
		if v.State != "ready" && v.State != "growing" {
			skipped = append(skipped, fmt.Sprintf("volume %s is %s: left out (export again once it is ready)", v.Name, v.State))
			continue
		}
		cv := config.Volume{Name: v.Name, Pool: v.Pool, NSID: v.NSID, Size: config.Size(v.Size), NGUID: v.NGUID, UUID: v.UUID, Hosts: v.Hosts}
		for _, e := range v.Extents {
			cv.Extents = append(cv.Extents, config.Extent{Off: config.Size(e.Off), Len: config.Size(e.Len)})
		}
		cfg.Volumes = append(cfg.Volumes, cv)
	}
	return &cfg, skipped, nil
}
