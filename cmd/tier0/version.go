package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"tier0/internal/version"
)

// newVersionCmd is `tier0 version`.
func newVersionCmd(root *rootOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the tier0 version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if root.json {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(version.Get())
			}
			_, err := fmt.Fprintln(out, version.String())
			return err
		},
	}
}
