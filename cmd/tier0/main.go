// Command tier0 is the tier0 CLI: configuration, cluster management, the
// standalone fabric tools, validation, benches, reports, Slurm hooks and the
// GPUDirect Storage validator. One verb (or verb group) per file; each file
// registers its commands on rootCmd in an init function.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// rootCmd is the top of the command tree. Verb files add to it in init().
var rootCmd = &cobra.Command{
	Use:           "tier0",
	Short:         "tier0: shared, protected Tier-0 storage from the NVMe drives inside compute nodes",
	SilenceUsage:  true,
	SilenceErrors: true,
}

// jsonOut is the global --json flag: machine-readable output on every verb.
var jsonOut bool

func init() {
	rootCmd.PersistentFlags().BoolVar(&jsonOut, "json", false, "print machine-readable JSON instead of tables")
}

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tier0:", err)
		os.Exit(exitCode(err))
	}
}

// exitCoder lets a verb choose its process exit code (for example the GDS
// validator's "not available" versus "proof failed").
type exitCoder interface{ ExitCode() int }

func exitCode(err error) int {
	if ec, ok := err.(exitCoder); ok {
		return ec.ExitCode()
	}
	return 1
}
