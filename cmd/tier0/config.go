package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/olekukonko/tablewriter"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/config"
	"tier0/daemon/discover"
)

// configInvalidError is returned by the config verbs for a configuration
// with problems (exit code 1); the problems are printed before.
type configInvalidError struct {
	file string
	n    int
}

func (e configInvalidError) Error() string {
	return fmt.Sprintf("%s: %d problem(s); fix them and run `tier0 config validate %s` again", e.file, e.n, e.file)
}

func (configInvalidError) ExitCode() int { return 1 }

// newConfigCmd is `tier0 config validate|placement|drives`.
func newConfigCmd(root *rootOptions) *cobra.Command {
	cfg := &cobra.Command{
		Use:   "config",
		Short: "Check site configurations and show array placement",
	}
	cfg.AddCommand(newConfigValidateCmd(root), newConfigPlacementCmd(root), newConfigDrivesCmd(root), newConfigExportCmd(root))
	return cfg
}

func newConfigValidateCmd(root *rootOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Validate a site configuration and list every problem",
		Long: "Validate a site configuration (YAML). Every problem is listed as\n" +
			"FILE: KEY: what is wrong, what was expected. Exit status 1 when invalid.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := loadSiteConfig(cmd, root.json, args[0])
			if err != nil {
				return err
			}
			drives := 0
			for _, n := range c.Nodes {
				drives += len(n.Drives)
			}
			if root.json {
				return writeJSON(cmd.OutOrStdout(), map[string]any{
					"file": args[0], "valid": true, "problems": []any{},
					"cluster": c.Cluster, "nodes": len(c.Nodes), "drives": drives, "arrays": len(c.Arrays),
				})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: cluster %s, %d nodes, %d drives, %d arrays\n",
				args[0], c.Cluster, len(c.Nodes), drives, len(c.Arrays))
			return err
		},
	}
}

func newConfigPlacementCmd(root *rootOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "placement FILE",
		Short: "Show which drives each array uses (automatic placement resolved)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := loadSiteConfig(cmd, root.json, args[0])
			if err != nil {
				return err
			}
			return configPrintPlacement(cmd.OutOrStdout(), root.json, c)
		},
	}
}

// configDrivesOptions are the flags of config drives.
type configDrivesOptions struct {
	node string
}

func (o *configDrivesOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.node, "node", "", "the node (of FILE) whose drives to resolve")
}

func newConfigDrivesCmd(root *rootOptions) *cobra.Command {
	o := &configDrivesOptions{}
	drives := &cobra.Command{
		Use:   "drives [FILE]",
		Short: "List this machine's NVMe drives, or resolve a node's configured drives",
		Long: "Without FILE: list the local NVMe namespaces (model, serial, size, by-id link).\n" +
			"With FILE and --node: resolve each drive of that node (path, by_id or serial)\n" +
			"to the device node or file tier0d would open.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			found, err := discover.Scan(discover.Options{})
			if err != nil {
				return err
			}
			if len(args) == 0 {
				return configPrintDrives(cmd.OutOrStdout(), root.json, found)
			}
			c, err := loadSiteConfig(cmd, root.json, args[0])
			if err != nil {
				return err
			}
			n, ok := c.Node(o.node)
			if !ok {
				return fmt.Errorf("--node %q: not a node of %s; expected one of the names under nodes[]", o.node, args[0])
			}
			return configPrintResolved(cmd.OutOrStdout(), root.json, n, found)
		},
	}
	o.AddFlags(drives.Flags())
	return drives
}

func configPrintDrives(w io.Writer, jsonOut bool, ds []discover.Drive) error {
	if jsonOut {
		if ds == nil {
			ds = []discover.Drive{}
		}
		return writeJSON(w, ds)
	}
	t := tablewriter.NewWriter(w)
	t.Header("DEVICE", "MODEL", "SERIAL", "FIRMWARE", "SIZE", "LBA", "LINK")
	for _, d := range ds {
		if err := t.Append(d.Path, d.Model, d.Serial, d.Firmware, config.Size(d.Size).String(), strconv.Itoa(d.BlockSize), d.ByID); err != nil {
			return err
		}
	}
	return t.Render()
}

type resolvedDrive struct {
	Drive  string `json:"drive"`
	Ref    string `json:"ref"`
	Path   string `json:"path,omitempty"`
	Serial string `json:"serial,omitempty"`
	Error  string `json:"error,omitempty"`
}

func configPrintResolved(w io.Writer, jsonOut bool, n *config.Node, found []discover.Drive) error {
	var rows []resolvedDrive
	bad := 0
	for _, d := range n.Drives {
		ref := d.Path + d.ByID
		if d.Serial != "" {
			ref = "serial " + d.Serial
		}
		r := resolvedDrive{Drive: d.Name, Ref: ref}
		res, err := discover.Resolve(discover.Options{}, found, d.Path, d.ByID, d.Serial)
		if err != nil {
			r.Error = err.Error()
			bad++
		} else {
			r.Path = res.Path
			if res.Drive != nil {
				r.Serial = res.Drive.Serial
			}
		}
		rows = append(rows, r)
	}
	if jsonOut {
		if err := writeJSON(w, rows); err != nil {
			return err
		}
	} else {
		t := tablewriter.NewWriter(w)
		t.Header("DRIVE", "CONFIGURED", "RESOLVED", "SERIAL", "ERROR")
		for _, r := range rows {
			if err := t.Append(r.Drive, r.Ref, r.Path, r.Serial, r.Error); err != nil {
				return err
			}
		}
		if err := t.Render(); err != nil {
			return err
		}
	}
	if bad > 0 {
		return fmt.Errorf("node %s: %d of %d drives could not be resolved", n.Name, bad, len(n.Drives))
	}
	return nil
}

// loadSiteConfig loads a configuration; on problems it prints them (as
// lines on stderr, or as JSON on stdout with --json) and returns a
// configInvalidError.
func loadSiteConfig(cmd *cobra.Command, jsonOut bool, file string) (*config.Config, error) {
	c, err := config.Load(file)
	var ve *config.ValidationError
	if errors.As(err, &ve) {
		if jsonOut {
			probs := make([]map[string]string, len(ve.Problems))
			for i, p := range ve.Problems {
				probs[i] = map[string]string{"file": p.File, "key": p.Key, "message": p.Msg}
			}
			if err := writeJSON(cmd.OutOrStdout(), map[string]any{"file": file, "valid": false, "problems": probs}); err != nil {
				return nil, err
			}
		} else {
			for _, p := range ve.Problems {
				fmt.Fprintln(cmd.ErrOrStderr(), p.String())
			}
		}
		return nil, configInvalidError{file, len(ve.Problems)}
	}
	return c, err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

type placedMember struct {
	Drive string `json:"drive"`
	Node  string `json:"node"`
}

type placedArray struct {
	Array   string         `json:"array"`
	Level   string         `json:"level"`
	Home    string         `json:"home"`
	Auto    bool           `json:"auto"`
	Members []placedMember `json:"members"`
}

func configPrintPlacement(w io.Writer, jsonOut bool, c *config.Config) error {
	var rows []placedArray
	width := 0
	for _, a := range c.Arrays {
		pa := placedArray{Array: a.Name, Level: a.Level, Home: a.Home, Auto: a.Auto, Members: []placedMember{}}
		for _, m := range a.Members {
			n, _, _ := c.Drive(m)
			pa.Members = append(pa.Members, placedMember{Drive: m, Node: n.Name})
		}
		width = max(width, len(a.Members))
		rows = append(rows, pa)
	}
	if jsonOut {
		return writeJSON(w, map[string]any{"cluster": c.Cluster, "arrays": rows})
	}
	header := []any{"ARRAY", "LEVEL", "HOME", "PLACED"}
	for i := 1; i <= width; i++ {
		header = append(header, "MEMBER "+strconv.Itoa(i))
	}
	t := tablewriter.NewWriter(w)
	t.Header(header...)
	for _, r := range rows {
		placed := "explicit"
		if r.Auto {
			placed = "auto"
		}
		row := []any{r.Array, r.Level, r.Home, placed}
		for i := 0; i < width; i++ {
			if i < len(r.Members) {
				row = append(row, r.Members[i].Drive)
			} else {
				row = append(row, "")
			}
		}
		if err := t.Append(row...); err != nil {
			return err
		}
	}
	return t.Render()
}
