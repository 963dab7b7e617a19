package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls a node's management API. It is safe for concurrent use.
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// NewClient returns a client for base (for example "http://10.0.0.1:7480"
// or "https://..."). token is sent on mutating calls only; hc may be nil (a
// client with a 10s timeout), or carry a TLS configuration.
func NewClient(base, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	return &Client{base: strings.TrimRight(base, "/"), token: token, hc: hc}
}

// Error is a non-2xx answer; it wraps the sentinel of its status code.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("api: %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

func (e *Error) Unwrap() error {
	switch e.Status {
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusBadRequest:
		return ErrBadRequest
	case http.StatusConflict:
		return ErrConflict
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrUnauthorized
	case http.StatusServiceUnavailable:
		return ErrUnavailable
	}
	return nil
}

func (c *Client) do(ctx context.Context, method, path string, auth bool, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, nil)
	if err != nil {
		return fmt.Errorf("api: build %s %s: %w", method, path, err)
	}
	if auth && c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("api: %s %s%s: %w (%w)", method, c.base, path, err, ErrUnavailable)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("api: read answer to %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return &Error{Status: resp.StatusCode, Message: msg}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("api: answer to %s %s is not the expected JSON: %w", method, path, err)
	}
	return nil
}

// Status is GET /v1/status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	return s, c.do(ctx, http.MethodGet, "/v1/status", false, &s)
}

// Arrays is GET /v1/arrays.
func (c *Client) Arrays(ctx context.Context) ([]Array, error) {
	var a []Array
	return a, c.do(ctx, http.MethodGet, "/v1/arrays", false, &a)
}

// Array is GET /v1/arrays/{name}; an unknown name wraps ErrNotFound.
func (c *Client) Array(ctx context.Context, name string) (Array, error) {
	var a Array
	return a, c.do(ctx, http.MethodGet, "/v1/arrays/"+url.PathEscape(name), false, &a)
}

// Events is GET /v1/events: entries written after revision after, at most
// limit (0: all).
func (c *Client) Events(ctx context.Context, after int64, limit int) ([]Event, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/events"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var e []Event
	return e, c.do(ctx, http.MethodGet, path, false, &e)
}

// NodeHealth is GET /v1/node/health.
func (c *Client) NodeHealth(ctx context.Context) (NodeHealth, error) {
	var h NodeHealth
	return h, c.do(ctx, http.MethodGet, "/v1/node/health", false, &h)
}

// Drain is POST /v1/nodes/{node}/drain.
func (c *Client) Drain(ctx context.Context, node string) error {
	return c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/drain", true, nil)
}

// Undrain is POST /v1/nodes/{node}/undrain.
func (c *Client) Undrain(ctx context.Context, node string) error {
	return c.do(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/undrain", true, nil)
}

// FailDrive is POST /v1/drives/{id}/fail.
func (c *Client) FailDrive(ctx context.Context, drive string) error {
	return c.do(ctx, http.MethodPost, "/v1/drives/"+url.PathEscape(drive)+"/fail", true, nil)
}

// ReplaceDrive is POST /v1/drives/{id}/replace.
func (c *Client) ReplaceDrive(ctx context.Context, drive string) error {
	return c.do(ctx, http.MethodPost, "/v1/drives/"+url.PathEscape(drive)+"/replace", true, nil)
}

// ScrubArray is POST /v1/arrays/{name}/scrub (repair: fix mismatches).
func (c *Client) ScrubArray(ctx context.Context, name string, repair bool) error {
	path := "/v1/arrays/" + url.PathEscape(name) + "/scrub"
	if repair {
		path += "?repair=true"
	}
	return c.do(ctx, http.MethodPost, path, true, nil)
}

// Metrics fetches GET /metrics as Prometheus text.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("api: GET %s/metrics: %w (%w)", c.base, err, ErrUnavailable)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode != http.StatusOK {
		return "", &Error{Status: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	}
	return string(b), err
}
