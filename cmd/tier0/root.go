package main

import (
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/api"
	"tier0/slurm-plugin/cli"
)

// rootOptions are the root's flags and what every command shares.
type rootOptions struct {
	// json is the global --json flag: machine-readable output on every verb.
	json bool

	// What the management verbs take from the machine; tests replace them.
	poll      time.Duration          // how often --wait and --follow ask again
	hostname  func() (string, error) // a site node of this name is asked first
	tokenFile string                 // read when no token is given
}

func (o *rootOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print machine-readable JSON instead of tables")
}

// defaultRootOptions are those of the real CLI.
func defaultRootOptions() *rootOptions {
	return &rootOptions{poll: time.Second, hostname: os.Hostname, tokenFile: defaultTokenFile}
}

// newRootCmd builds the whole command tree.
func newRootCmd() *cobra.Command { return newRootCmdWith(defaultRootOptions()) }

// newRootCmdWith builds the command tree around o.
func newRootCmdWith(o *rootOptions) *cobra.Command {
	root := &cobra.Command{
		Use:           "tier0",
		Short:         "tier0: shared, protected Tier-0 storage from the NVMe drives inside compute nodes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	o.AddFlags(root.PersistentFlags())
	root.AddCommand(
		newStatusCmd(o),
		newArrayCmd(o),
		newVolumeCmd(o),
		newNodeCmd(o),
		newDriveCmd(o),
		newEventsCmd(o),
		newConfigCmd(o),
		newFabricCmd(o),
		newValidateCmd(o),
		newCampaignCmd(o),
		newReportCmd(o),
		newGdsCmd(o),
		newVersionCmd(o),
		// `tier0 slurm prolog|epilog|healthcheck`: the Slurm hooks (docs/SLURM.md).
		cli.Command(&o.json),
	)
	return root
}

// exitCoder lets a verb choose its process exit code (for example the GDS
// validator's "not available" versus "proof failed").
type exitCoder interface{ ExitCode() int }

func exitCode(err error) int {
	if ec, ok := err.(exitCoder); ok {
		return ec.ExitCode()
	}
	if _, ok := err.(*api.UnreachableError); ok {
		return exitUnreachable
	}
	return 1
}
