package main

import "github.com/spf13/cobra"

// newFabricCmd is `tier0 fabric`: the standalone NVMe/TCP tools.
func newFabricCmd(root *rootOptions) *cobra.Command {
	g := &cobra.Command{Use: "fabric", Short: "Standalone NVMe/TCP tools: serve a target, read/write/verify through the initiator"}
	g.AddCommand(newFabricServeCmd(root), newFabricIOCmd(root), newFabricPerfCmd(root), newFabricGenKeyCmd())
	return g
}
