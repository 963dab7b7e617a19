package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/bench"
	"tier0/reports"
)

// reportOptions are the flags of `tier0 report`.
type reportOptions struct {
	outDir string
}

func (o *reportOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVarP(&o.outDir, "out", "o", "tier0-report", "folder to write report.html, report.md and img/ into")
}

// newReportCmd is `tier0 report RESULTS.json`.
func newReportCmd(root *rootOptions) *cobra.Command {
	o := &reportOptions{}
	cmd := &cobra.Command{
		Use:   "report RESULTS.json",
		Short: "Print a bench/validate results file as tables and write the HTML and Markdown report",
		Long: `Reads a tier0.bench/v1 results file (written by tier0 validate or a bench run),
prints its checks, the side-by-side comparison with the seed (xiRAID Opus at the
Weizmann Institute) and the measurements as tables, and writes report.html (one
file, plots embedded), report.md and img/*.png into --out.

With --json it prints the written paths as JSON instead of the tables.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := bench.ReadFile(args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !root.json {
				if err := reports.WriteTables(out, res); err != nil {
					return err
				}
			}
			paths, err := reports.Generate(res, o.outDir)
			if err != nil {
				return err
			}
			if root.json {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(paths)
			}
			_, err = fmt.Fprintf(out, "\nreport: %s\nsummary: %s\n", paths.HTML, paths.Markdown)
			return err
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
