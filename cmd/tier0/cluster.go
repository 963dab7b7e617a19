package main

// How the management verbs (status, array, node, drive, events) reach a
// running cluster: the management API of any tier0d, found through the site
// configuration (every node's api endpoint, tried in turn until one
// answers) or given directly with --api. The client that tries them is
// daemon/api's Cluster.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/olekukonko/tablewriter"
	"github.com/olekukonko/tablewriter/tw"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
)

// Exit codes of the management verbs (besides 0 for success and 1 for an
// error or a refused request).
const (
	// exitUnreachable: no node's management API answered
	// (*api.UnreachableError).
	exitUnreachable = 3
)

// defaultSiteFile is where tier0d and tier0 look for the site
// configuration when neither a flag nor TIER0_SITE names one.
const defaultSiteFile = "/etc/tier0/site.yaml"

// defaultTokenFile is read when no token is given.
const defaultTokenFile = "/etc/tier0/token"

// clusterOptions are the flags shared by every management verb: each verb
// group adds them as persistent flags, so that `tier0 status --site F` and
// `tier0 node --site F drain B` both work while other verbs (config, gds,
// ...) keep their own flags.
type clusterOptions struct {
	root      *rootOptions
	site      string
	apiURL    string
	token     string
	tokenFile string
	caFile    string
	timeout   time.Duration
}

func (o *clusterOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.site, "site", "", "site configuration: try each node's API in turn [$TIER0_SITE, else "+defaultSiteFile+"]")
	fs.StringVar(&o.apiURL, "api", "", "one node's management API, e.g. http://10.0.0.1:7480 (instead of --site) [$TIER0_API]")
	fs.StringVar(&o.token, "token", "", "bearer token for changes (drain, fail, replace) [$TIER0_TOKEN, else /etc/tier0/token if readable]")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token (as tier0d --token-file)")
	fs.StringVar(&o.caFile, "ca", "", "PEM CA bundle to verify an https:// --api")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "give up on one node's API after this long and try the next")
}

// newClusterGroup returns the options of a management verb group cmd,
// its flags added to cmd's persistent flags.
func newClusterGroup(root *rootOptions, cmd *cobra.Command) *clusterOptions {
	o := &clusterOptions{root: root}
	o.AddFlags(cmd.PersistentFlags())
	return o
}

// clusterConn is the cluster's API as the CLI asks it: daemon/api's
// multi-endpoint client, with what to do added to the API's refusals.
type clusterConn struct{ *api.Cluster }

// call runs f against the endpoints in turn until one answers (success or
// a definite refusal such as 404, 401, 409).
func (c *clusterConn) call(ctx context.Context, f func(*api.Client) error) error {
	return explain(c.Call(ctx, f))
}

// status fetches the cluster view.
func (c *clusterConn) status(ctx context.Context) (api.Status, error) {
	s, err := c.Status(ctx)
	return s, explain(err)
}

// briefly is err on one line: for an unreachable cluster the addresses and
// reasons without the advice (progress lines of --wait and --follow).
func briefly(err error) string {
	var ue *api.UnreachableError
	if !errors.As(err, &ue) {
		return strings.Join(strings.Fields(err.Error()), " ")
	}
	return ue.Brief()
}

// connect builds the connection from the flags and the environment.
func (o *clusterOptions) connect() (*clusterConn, error) {
	site, apiURL := o.site, o.apiURL
	if apiURL == "" && site == "" {
		apiURL = os.Getenv("TIER0_API")
	}
	if site == "" && apiURL == "" {
		site = os.Getenv("TIER0_SITE")
	}
	if site == "" && apiURL == "" {
		if _, err := os.Stat(defaultSiteFile); err == nil {
			site = defaultSiteFile
		}
	}
	var eps []api.Endpoint
	var source string
	switch {
	case site != "" && apiURL != "":
		return nil, fmt.Errorf("both --site %s and --api %s given; give one of them", site, apiURL)
	case apiURL != "":
		u := apiURL
		if !strings.Contains(u, "://") {
			u = "http://" + u
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("--api %q: want an http:// or https:// URL such as http://10.0.0.1:7480", apiURL)
		}
		eps = []api.Endpoint{{URL: strings.TrimRight(u, "/")}}
		source = "--api"
	case site != "":
		cfg, err := mgmtLoadSite(site)
		if err != nil {
			return nil, err
		}
		self, _ := o.root.hostname()
		eps = api.SiteEndpoints(cfg, self)
		source = site
	default:
		return nil, fmt.Errorf("no cluster to ask: give --site FILE (or set TIER0_SITE) to try every node's API, or --api http://HOST:PORT (or TIER0_API); %s does not exist", defaultSiteFile)
	}
	tok, err := resolveToken(o.token, o.tokenFile, o.root.tokenFile)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: o.timeout}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca %s: no PEM certificate found in it", o.caFile)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	return &clusterConn{api.NewCluster(eps, api.ClusterOptions{Token: tok, HTTP: hc, Source: source,
		Hint: "; or name one node's API with --api http://HOST:PORT"})}, nil
}

// resolveToken: the flag, else the file, else $TIER0_TOKEN, else the
// daemon's token file dflt when readable.
func resolveToken(flagTok, file, dflt string) (string, error) {
	if flagTok != "" {
		return flagTok, nil
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if t := os.Getenv("TIER0_TOKEN"); t != "" {
		return t, nil
	}
	// On a node, root may read the token the daemon uses (dist/install.sh
	// puts it there); anyone else gets the API's 401 with advice.
	if b, err := os.ReadFile(dflt); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	return "", nil
}

// explain adds what to do to the API's refusals.
func explain(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, api.ErrUnauthorized):
		return fmt.Errorf("%w; give the token tier0d runs with (its --token-file or TIER0_TOKEN, see /etc/default/tier0d) with --token, --token-file or TIER0_TOKEN", err)
	}
	return err
}

// show is the prologue of the management verbs that print one view:
// connect, get the view, and print it as indented JSON with --json, else
// with print.
func show[T any](cmd *cobra.Command, o *clusterOptions, get func(context.Context, *clusterConn) (T, error), print func(io.Writer, T) error) error {
	c, err := o.connect()
	if err != nil {
		return err
	}
	v, err := get(cmd.Context(), c)
	if err != nil {
		return err
	}
	if o.root.json {
		return mgmtJSON(cmd.OutOrStdout(), v)
	}
	return print(cmd.OutOrStdout(), v)
}

// clusterStatus is the get of show for the views made from /v1/status.
func clusterStatus[T any](view func(api.Status) T) func(context.Context, *clusterConn) (T, error) {
	return func(ctx context.Context, c *clusterConn) (T, error) {
		s, err := c.status(ctx)
		if err != nil {
			var zero T
			return zero, err
		}
		return view(s), nil
	}
}

// rebuildBar renders a percentage as "[#####.....] 52%".
func rebuildBar(pct int) string {
	pct = min(max(pct, 0), 100)
	const width = 10
	n := pct * width / 100
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "] " + fmt.Sprintf("%d%%", pct)
}

// inMotion: a member being brought back in sync.
func inMotion(m cluster.MemberView) bool {
	return m.State == cluster.MemberResyncing || m.State == cluster.MemberRebuilding
}

// memberList shows an array's members in RAID order; members not in sync
// carry their state, e.g. "B1 C1 D1(missing) E1".
func memberList(a api.Array) string {
	parts := make([]string, len(a.Members))
	for i, m := range a.Members {
		parts[i] = m.Drive
		if m.State != cluster.MemberOK {
			parts[i] += "(" + string(m.State) + ")"
		}
	}
	return strings.Join(parts, " ")
}

// orDash shows an empty value as "-".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// mgmtTable is the table style of the management verbs.
func mgmtTable(w io.Writer, header ...any) *tablewriter.Table {
	t := tablewriter.NewTable(w, tablewriter.WithHeaderAutoFormat(tw.Off), tablewriter.WithRowAutoWrap(tw.WrapNone))
	t.Header(header...)
	return t
}

// mgmtRender appends rows and renders the table.
func mgmtRender(t *tablewriter.Table, rows [][]any) error {
	for _, r := range rows {
		if err := t.Append(r...); err != nil {
			return err
		}
	}
	return t.Render()
}

// mgmtJSON writes v as indented JSON.
func mgmtJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// mgmtLoadSite loads a site configuration; a configuration with problems
// is an error listing each one.
func mgmtLoadSite(file string) (*config.Config, error) {
	c, err := config.Load(file)
	if err != nil {
		return nil, fmt.Errorf("%w (check it with `tier0 config validate %s`)", err, file)
	}
	return c, nil
}
