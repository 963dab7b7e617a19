package api

// The multi-endpoint client: one cluster's management APIs, any of which
// answers for the whole cluster (every node serves the same view from the
// store), asked in turn until one answers.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"tier0/daemon/config"
)

// Endpoint is one node's management API.
type Endpoint struct {
	Node string // node name from the site configuration; empty when given directly
	URL  string
}

func (e Endpoint) String() string {
	if e.Node == "" {
		return e.URL
	}
	return fmt.Sprintf("%s (node %s)", e.URL, e.Node)
}

// SiteEndpoints lists every node's API URL in site order, with the node
// named self (a host name; only its first label counts) first.
func SiteEndpoints(cfg *config.Config, self string) []Endpoint {
	self = strings.Split(self, ".")[0]
	var eps []Endpoint
	for i := range cfg.Nodes {
		n := &cfg.Nodes[i]
		ep := Endpoint{Node: n.Name, URL: "http://" + n.AdvertiseAddr(n.API)}
		if self != "" && n.Name == self {
			eps = append([]Endpoint{ep}, eps...)
		} else {
			eps = append(eps, ep)
		}
	}
	return eps
}

// Cluster asks a cluster's endpoints in turn; the first that answers is
// asked first next time. It is not safe for concurrent use (the order of
// its endpoints changes as they answer).
type Cluster struct {
	eps    []Endpoint
	token  string
	hc     *http.Client
	source string
	hint   string
}

// ClusterOptions configure NewCluster.
type ClusterOptions struct {
	// Token is the bearer token sent on mutating calls.
	Token string
	// HTTP is the client for every endpoint (timeout, TLS); nil takes
	// NewClient's default.
	HTTP *http.Client
	// Source says where the endpoints came from ("--api", a site file), for
	// error messages.
	Source string
	// Hint is appended to the advice of an UnreachableError, e.g. "; or
	// name one node's API with --api http://HOST:PORT".
	Hint string
}

// NewCluster returns a client for eps (tried in this order).
func NewCluster(eps []Endpoint, o ClusterOptions) *Cluster {
	return &Cluster{eps: eps, token: o.Token, hc: o.HTTP, source: o.Source, hint: o.Hint}
}

// Endpoints are the endpoints in the order they are asked next.
func (c *Cluster) Endpoints() []Endpoint { return c.eps }

// Source says where the endpoints came from.
func (c *Cluster) Source() string { return c.source }

// Attempt is one endpoint that did not answer, and why.
type Attempt struct {
	Endpoint Endpoint
	Err      error
}

// UnreachableError is returned when no endpoint answered. It names each
// address tried and why, and what to do. It wraps ErrUnavailable.
type UnreachableError struct {
	Source string
	Tried  []Attempt
	Hint   string // appended to the advice
}

func (e *UnreachableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no tier0d management API answered (addresses from %s); tried:", e.Source)
	for _, a := range e.Tried {
		fmt.Fprintf(&b, "\n  %s: %v", a.Endpoint, a.Err)
	}
	b.WriteString("\nWhat to do: check that tier0d runs on those nodes (systemctl status tier0d; journalctl -u tier0d)," +
		" that the api address and port in the site configuration are where it listens, and that this host may reach them" +
		e.Hint + ".")
	return b.String()
}

// Unwrap lets callers test errors.Is(err, ErrUnavailable).
func (e *UnreachableError) Unwrap() error { return ErrUnavailable }

// Brief is the error on one line: the addresses and reasons without the
// advice (for progress lines).
func (e *UnreachableError) Brief() string {
	parts := make([]string, len(e.Tried))
	for i, a := range e.Tried {
		parts[i] = fmt.Sprintf("%s: %v", a.Endpoint, a.Err)
	}
	return "no tier0d API answered: " + strings.Join(parts, "; ")
}

// Retryable reports whether err means that the endpoint did not answer or
// cannot answer now, so that another node may.
func Retryable(err error) bool {
	var ae *Error
	if errors.As(err, &ae) {
		return ae.Status >= 500
	}
	return errors.Is(err, ErrUnavailable)
}

// Call runs f against the endpoints in turn until one answers: success, or
// a definite refusal such as 404, 401 or 409, which is returned as it is.
// When none answers it returns an *UnreachableError (or ctx's error once
// ctx has ended).
func (c *Cluster) Call(ctx context.Context, f func(*Client) error) error {
	var tried []Attempt
	for i, ep := range c.eps {
		err := f(NewClient(ep.URL, c.token, c.hc))
		if err == nil || !Retryable(err) {
			if i > 0 { // ask this one first from now on
				c.eps[0], c.eps[i] = c.eps[i], c.eps[0]
			}
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		tried = append(tried, Attempt{ep, err})
	}
	return &UnreachableError{Source: c.source, Tried: tried, Hint: c.hint}
}

// Status fetches the cluster view from the first node that answers.
func (c *Cluster) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.Call(ctx, func(cl *Client) error {
		var err error
		s, err = cl.Status(ctx)
		return err
	})
	return s, err
}

// Only narrows the client to node's endpoint. With a single endpoint given
// directly (no node name) it keeps that one: the caller checks who answers.
func (c *Cluster) Only(node string) error {
	var names []string
	for _, ep := range c.eps {
		if ep.Node == node {
			c.eps = []Endpoint{ep}
			return nil
		}
		names = append(names, ep.Node)
	}
	if len(c.eps) == 1 && c.eps[0].Node == "" {
		return nil
	}
	return fmt.Errorf("node %q is not in %s; its nodes are %s", node, c.source, strings.Join(names, ", "))
}
