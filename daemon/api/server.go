package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ServerOptions configure NewServer.
type ServerOptions struct {
	Backend Backend
	// Token is the bearer token for mutating calls. When empty, mutating
	// calls are refused (401) unless AllowUnauthenticated is set (a
	// loopback-only demo).
	Token                string
	AllowUnauthenticated bool
	// TLS, when set, makes Serve speak HTTPS with it.
	TLS *tls.Config
	// Metrics is served at /metrics (default NewMetrics()).
	Metrics *Metrics
	// Logger gets one line per request: method, route, status, duration.
	// Headers (and so the token) are never logged. Default: discard.
	Logger *slog.Logger
	// ShutdownTimeout bounds the graceful shutdown when Serve's context
	// ends (default 5s).
	ShutdownTimeout time.Duration
}

// Server is the management API. Create it with NewServer.
type Server struct {
	opts     ServerOptions
	tokenSum [32]byte
	mux      *http.ServeMux
	log      *slog.Logger
}

// NewServer checks the options and builds the routes.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.Backend == nil {
		return nil, fmt.Errorf("api: no Backend given: %w", ErrBadRequest)
	}
	if opts.Metrics == nil {
		opts.Metrics = NewMetrics()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = 5 * time.Second
	}
	s := &Server{opts: opts, tokenSum: sha256.Sum256([]byte(opts.Token)), mux: http.NewServeMux(), log: opts.Logger}
	b := opts.Backend
	s.get("/v1/status", func(r *http.Request) (any, error) { return b.Status(r.Context()) })
	s.get("/v1/arrays", func(r *http.Request) (any, error) { return b.Arrays(r.Context()) })
	s.get("/v1/arrays/{name}", func(r *http.Request) (any, error) { return b.Array(r.Context(), r.PathValue("name")) })
	s.get("/v1/events", func(r *http.Request) (any, error) {
		after, err := queryInt(r, "after")
		if err != nil {
			return nil, err
		}
		limit, err := queryInt(r, "limit")
		if err != nil {
			return nil, err
		}
		return b.Events(r.Context(), after, int(limit))
	})
	s.get("/v1/node/health", func(r *http.Request) (any, error) {
		h, err := b.NodeHealth(r.Context())
		if h.DrivesMissing == nil {
			h.DrivesMissing = []string{}
		}
		if h.Arrays == nil {
			h.Arrays = []ArrayHealth{}
		}
		return h, err
	})
	s.post("/v1/nodes/{node}/drain", "node", b.Drain)
	s.post("/v1/nodes/{node}/undrain", "node", b.Undrain)
	s.post("/v1/drives/{drive}/fail", "drive", b.FailDrive)
	s.post("/v1/drives/{drive}/replace", "drive", b.ReplaceDrive)
	if sc, ok := b.(Scrubber); ok {
		s.mux.Handle("POST /v1/arrays/{name}/scrub", s.observe("/v1/arrays/{name}/scrub", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.scrub(sc, w, r)
		})))
	}
	if v, ok := b.(Volumer); ok {
		s.volumeRoutes(v) // volumes.go
	}
	if p, ok := b.(ArrayProvisioner); ok {
		s.arrayRoutes(p) // arrays_online.go
	}
	if sc, ok := b.(SiteConfiger); ok {
		s.siteConfigRoutes(sc) // siteconfig.go
	}
	metrics := promhttp.HandlerFor(opts.Metrics.Registry, promhttp.HandlerOpts{Registry: opts.Metrics.Registry})
	s.mux.Handle("GET /metrics", s.observe("/metrics", metrics))
	s.mux.Handle("/", s.observe("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("no endpoint %s %s; see GET /v1/status: %w", r.Method, r.URL.Path, ErrNotFound))
	})))
	return s, nil
}

// Handler is the server's http.Handler (for tests or another listener).
func (s *Server) Handler() http.Handler { return s.mux }

// Metrics is the registry served at /metrics.
func (s *Server) Metrics() *Metrics { return s.opts.Metrics }

// Serve answers on l until ctx ends, then shuts down gracefully. It
// returns nil after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.opts.TLS != nil {
		l = tls.NewListener(l, s.opts.TLS)
	}
	hs := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	done := make(chan error, 1)
	go func() { done <- hs.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.ShutdownTimeout)
		defer cancel()
		err := hs.Shutdown(sctx)
		<-done
		return err
	}
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (s *Server) observe(route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		s.opts.Metrics.APIRequests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
		s.log.Info("api request", "method", r.Method, "route", route, "status", rec.code, "took", time.Since(start), "remote", r.RemoteAddr)
	})
}

func (s *Server) get(pattern string, f func(*http.Request) (any, error)) {
	s.mux.Handle("GET "+pattern, s.observe(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})))
}

func (s *Server) post(pattern, param string, f func(context.Context, string) error) {
	s.mux.Handle("POST "+pattern, s.observe(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.authorize(r); err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tier0"`)
			writeError(w, err)
			return
		}
		v := r.PathValue(param)
		if err := f(r.Context(), v); err != nil {
			writeError(w, err)
			return
		}
		action := pattern[strings.LastIndex(pattern, "/")+1:]
		writeJSON(w, http.StatusOK, map[string]string{param: v, "action": action, "result": "accepted"})
	})))
}

func (s *Server) scrub(sc Scrubber, w http.ResponseWriter, r *http.Request) {
	if err := s.authorize(r); err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tier0"`)
		writeError(w, err)
		return
	}
	repair := false
	if v := r.URL.Query().Get("repair"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, fmt.Errorf("query repair=%q: want true or false: %w", v, ErrBadRequest))
			return
		}
		repair = b
	}
	name := r.PathValue("name")
	if err := sc.ScrubArray(r.Context(), name, repair); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"array": name, "action": "scrub", "repair": repair, "result": "accepted"})
}

// authorize checks the bearer token in constant time (comparing SHA-256
// sums, so that not even the length leaks). The token is never logged.
func (s *Server) authorize(r *http.Request) error {
	if s.opts.Token == "" {
		if s.opts.AllowUnauthenticated {
			return nil
		}
		return fmt.Errorf("this daemon has no API token configured, so mutating calls are refused; set api.token in the site config: %w", ErrUnauthorized)
	}
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return fmt.Errorf("mutating call without \"Authorization: Bearer <token>\": %w", ErrUnauthorized)
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	if subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) != 1 {
		return fmt.Errorf("bearer token does not match this daemon's API token: %w", ErrUnauthorized)
	}
	return nil
}

func queryInt(r *http.Request, k string) (int64, error) {
	v := r.URL.Query().Get(k)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("query %s=%q: want a non-negative integer: %w", k, v, ErrBadRequest)
	}
	return n, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// statusOf maps an error to its HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, ErrConflict):
		return http.StatusConflict
	case errors.Is(err, ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, statusOf(err), map[string]string{"error": err.Error()})
}
