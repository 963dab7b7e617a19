package main

import "tier0/slurm-plugin/cli"

// `tier0 slurm prolog|epilog|healthcheck`: the Slurm hooks (docs/SLURM.md).
func init() {
	rootCmd.AddCommand(cli.Command(&jsonOut))
}
