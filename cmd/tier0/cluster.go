package main

// How the management verbs (status, array, node, drive, events) reach a
// running cluster: the management API of any tier0d, found through the site
// configuration (every node's api endpoint, tried in turn until one
// answers) or given directly with --api.

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
	// exitUnsupported: the request is not something the API does in this
	// release (array create/delete); what to do instead was printed.
	exitUnsupported = 2
	// exitUnreachable: no node's management API answered.
	exitUnreachable = 3
)

// defaultSiteFile is where tier0d and tier0 look for the site
// configuration when neither a flag nor TIER0_SITE names one.
const defaultSiteFile = "/etc/tier0/site.yaml"

// clusterOpts are the flags shared by every management verb.
var clusterOpts struct {
	site      string
	apiURL    string
	token     string
	tokenFile string
	caFile    string
	timeout   time.Duration
}

// clusterFlags is added (as persistent flags) to each management verb
// group, so that `tier0 status --site F` and `tier0 node --site F drain B`
// both work while other verbs (config, gds, ...) keep their own flags.
var clusterFlags = func() *pflag.FlagSet {
	fs := pflag.NewFlagSet("cluster", pflag.ContinueOnError)
	fs.StringVar(&clusterOpts.site, "site", "", "site configuration: try each node's API in turn [$TIER0_SITE, else "+defaultSiteFile+"]")
	fs.StringVar(&clusterOpts.apiURL, "api", "", "one node's management API, e.g. http://10.0.0.1:7480 (instead of --site) [$TIER0_API]")
	fs.StringVar(&clusterOpts.token, "token", "", "bearer token for changes (drain, fail, replace) [$TIER0_TOKEN, else /etc/tier0/token if readable]")
	fs.StringVar(&clusterOpts.tokenFile, "token-file", "", "file holding the bearer token (as tier0d --token-file)")
	fs.StringVar(&clusterOpts.caFile, "ca", "", "PEM CA bundle to verify an https:// --api")
	fs.DurationVar(&clusterOpts.timeout, "timeout", 5*time.Second, "give up on one node's API after this long and try the next")
	return fs
}()

func addClusterFlags(cmd *cobra.Command) *cobra.Command {
	cmd.PersistentFlags().AddFlagSet(clusterFlags)
	return cmd
}

// mgmtPoll is how often --wait and --follow ask again (tests shorten
// it).
var mgmtPoll = time.Second

// mgmtHostname names the machine the CLI runs on; a site node of that name is
// tried first. A variable so that tests are independent of the host.
var mgmtHostname = os.Hostname

// endpoint is one management API the CLI may ask.
type endpoint struct {
	node string // node name from the site config; empty for --api
	url  string
}

func (e endpoint) String() string {
	if e.node == "" {
		return e.url
	}
	return fmt.Sprintf("%s (node %s)", e.url, e.node)
}

// clusterConn asks the endpoints in turn; the first that answers is asked
// first next time.
type clusterConn struct {
	eps    []endpoint
	token  string
	hc     *http.Client
	source string // how the endpoints were found, for error messages
}

// attempt is one endpoint that did not answer.
type attempt struct {
	ep  endpoint
	err error
}

// unreachableError: no endpoint answered. It names each address tried and
// why, and what to do.
type unreachableError struct {
	source string
	tried  []attempt
}

func (e *unreachableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no tier0d management API answered (addresses from %s); tried:", e.source)
	for _, a := range e.tried {
		fmt.Fprintf(&b, "\n  %s: %v", a.ep, a.err)
	}
	b.WriteString("\nWhat to do: check that tier0d runs on those nodes (systemctl status tier0d; journalctl -u tier0d)," +
		" that the api address and port in the site configuration are where it listens, and that this host may reach them;" +
		" or name one node's API with --api http://HOST:PORT.")
	return b.String()
}

func (e *unreachableError) ExitCode() int { return exitUnreachable }

// briefly is err on one line: for an unreachableError the addresses and
// reasons without the advice (progress lines of --wait and --follow).
func briefly(err error) string {
	var ue *unreachableError
	if !errors.As(err, &ue) {
		return strings.Join(strings.Fields(err.Error()), " ")
	}
	parts := make([]string, len(ue.tried))
	for i, a := range ue.tried {
		parts[i] = fmt.Sprintf("%s: %v", a.ep, a.err)
	}
	return "no tier0d API answered: " + strings.Join(parts, "; ")
}

// Unwrap lets callers test errors.Is(err, api.ErrUnavailable).
func (e *unreachableError) Unwrap() error { return api.ErrUnavailable }

// connect builds the connection from the flags and the environment.
func connect() (*clusterConn, error) {
	o := clusterOpts
	if o.apiURL == "" && o.site == "" {
		o.apiURL = os.Getenv("TIER0_API")
	}
	if o.site == "" && o.apiURL == "" {
		o.site = os.Getenv("TIER0_SITE")
	}
	if o.site == "" && o.apiURL == "" {
		if _, err := os.Stat(defaultSiteFile); err == nil {
			o.site = defaultSiteFile
		}
	}
	c := &clusterConn{}
	switch {
	case o.site != "" && o.apiURL != "":
		return nil, fmt.Errorf("both --site %s and --api %s given; give one of them", o.site, o.apiURL)
	case o.apiURL != "":
		u := o.apiURL
		if !strings.Contains(u, "://") {
			u = "http://" + u
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return nil, fmt.Errorf("--api %q: want an http:// or https:// URL such as http://10.0.0.1:7480", o.apiURL)
		}
		c.eps = []endpoint{{url: strings.TrimRight(u, "/")}}
		c.source = "--api"
	case o.site != "":
		cfg, err := mgmtLoadSite(o.site)
		if err != nil {
			return nil, err
		}
		c.eps = siteEndpoints(cfg)
		c.source = o.site
	default:
		return nil, fmt.Errorf("no cluster to ask: give --site FILE (or set TIER0_SITE) to try every node's API, or --api http://HOST:PORT (or TIER0_API); %s does not exist", defaultSiteFile)
	}
	tok, err := resolveToken(o.token, o.tokenFile)
	if err != nil {
		return nil, err
	}
	c.token = tok
	c.hc = &http.Client{Timeout: o.timeout}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca %s: no PEM certificate found in it", o.caFile)
		}
		c.hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	return c, nil
}

func resolveToken(flagTok, file string) (string, error) {
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
	if b, err := os.ReadFile(defaultTokenFile); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	return "", nil
}

// defaultTokenFile is read when no token is given (a variable for tests).
var defaultTokenFile = "/etc/tier0/token"

// siteEndpoints lists every node's API URL in site order, with the node
// this CLI runs on (by host name) first.
func siteEndpoints(cfg *config.Config) []endpoint {
	self := ""
	if h, err := mgmtHostname(); err == nil {
		self = strings.Split(h, ".")[0]
	}
	var eps []endpoint
	for i := range cfg.Nodes {
		n := &cfg.Nodes[i]
		ep := endpoint{node: n.Name, url: "http://" + n.AdvertiseAddr(n.API)}
		if n.Name == self {
			eps = append([]endpoint{ep}, eps...)
		} else {
			eps = append(eps, ep)
		}
	}
	return eps
}

// retryable: the endpoint did not answer or cannot answer now, so another
// node may.
func retryable(err error) bool {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Status >= 500
	}
	return errors.Is(err, api.ErrUnavailable)
}

// call runs f against the endpoints in turn until one answers (success or
// a definite refusal such as 404, 401, 409).
func (c *clusterConn) call(ctx context.Context, f func(*api.Client) error) error {
	var tried []attempt
	for i, ep := range c.eps {
		err := f(api.NewClient(ep.url, c.token, c.hc))
		if err == nil || !retryable(err) {
			if i > 0 { // ask this one first from now on
				c.eps[0], c.eps[i] = c.eps[i], c.eps[0]
			}
			return explain(err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		tried = append(tried, attempt{ep, err})
	}
	return &unreachableError{source: c.source, tried: tried}
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

// status fetches the cluster view.
func (c *clusterConn) status(ctx context.Context) (api.Status, error) {
	var s api.Status
	err := c.call(ctx, func(cl *api.Client) error {
		var err error
		s, err = cl.Status(ctx)
		return err
	})
	return s, err
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

// appendRows appends rows and renders the table.
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
