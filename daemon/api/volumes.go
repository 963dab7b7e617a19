package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Volume endpoints (docs/VOLUMES.md), served when the Backend is a Volumer:
//
//	GET  /v1/volumes                              every volume
//	GET  /v1/volumes/{name}                       one volume (404 if unknown)
//	POST /v1/volumes?name=N&pool=P&size=BYTES[&host=NQN...]
//	                                              create a thick volume [token]
//	POST /v1/volumes/{name}/hosts[?host=NQN...]   set its host allow-list
//	                                              (none: every host)    [token]
//	POST /v1/volumes/{name}/resize?size=BYTES     grow it               [token]
//	POST /v1/volumes/{name}/delete[?force=true]   delete it             [token]
//
// Deleting a volume that hosts are connected to or hold a reservation on
// answers 409 naming them unless force is set. Deleting a pool's implicit
// whole-array volume (named after the pool) always needs force: it frees
// the pool for carved volumes and its data is lost.

// Extent is a range of the pool's bytes a volume maps.
type Extent struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// Volume is one volume as the API shows it.
type Volume struct {
	Name    string   `json:"name"`
	Pool    string   `json:"pool"`
	NSID    uint32   `json:"nsid"`
	Size    int64    `json:"size"` // exposed bytes
	State   string   `json:"state"`
	NGUID   string   `json:"nguid"`
	UUID    string   `json:"uuid"`
	SubNQN  string   `json:"subnqn"`
	Extents []Extent `json:"extents"`
	// Hosts, when not empty, are the only host NQNs that see and may use
	// the namespace; empty: every host the pool's subsystem admits.
	Hosts []string `json:"hosts,omitempty"`
	// Pending are allocated extents not yet zeroed (creating, growing).
	Pending   []Extent  `json:"pending,omitempty"`
	Implicit  bool      `json:"implicit,omitempty"`
	RemovedOn []string  `json:"removed_on,omitempty"`
	Created   time.Time `json:"created,omitzero"`
	// Holders are the hosts connected to the volume's subsystem or
	// registered for its reservations (show and a refused delete).
	Holders []VolumeHolder `json:"holders,omitempty"`
}

// VolumeHolder is a host that uses a volume: connected through a node's
// frontend, or registered (or holding) its reservation.
type VolumeHolder struct {
	HostNQN string `json:"host_nqn,omitempty"`
	HostID  string `json:"host_id"`
	Node    string `json:"node,omitempty"` // the frontend it is connected through
	// Reservation: "holder", "registrant" or "" (only connected).
	Reservation string `json:"reservation,omitempty"`
}

// String names the holder for messages: "HOSTNQN connected through node
// N", or "HOSTNQN, reservation holder" for one known only by its
// reservation (the host ID stands in for a host that gave no NQN).
func (h VolumeHolder) String() string {
	who := h.HostNQN
	if who == "" {
		who = "host ID " + h.HostID
	}
	if h.Node != "" {
		return who + " connected through node " + h.Node
	}
	return who + ", reservation " + h.Reservation
}

// Volumer is the optional part of a Backend that serves the volume
// endpoints; a Backend without it answers 404 there.
type Volumer interface {
	Volumes(ctx context.Context) ([]Volume, error)
	Volume(ctx context.Context, name string) (Volume, error)
	// CreateVolume allocates size bytes of pool; the volume is served by
	// every node once the pool's owner has zeroed it, to hosts only (when
	// not empty).
	CreateVolume(ctx context.Context, name, pool string, size int64, hosts []string) (Volume, error)
	// SetVolumeHosts replaces a volume's host allow-list (empty: every
	// host the pool's subsystem admits).
	SetVolumeHosts(ctx context.Context, name string, hosts []string) (Volume, error)
	// ResizeVolume grows a volume to size bytes.
	ResizeVolume(ctx context.Context, name string, size int64) (Volume, error)
	// DeleteVolume removes a volume from every node; with holders it
	// fails (ErrConflict, naming them) unless force.
	DeleteVolume(ctx context.Context, name string, force bool) (Volume, error)
}

func (s *Server) volumeRoutes(v Volumer) {
	s.get("/v1/volumes", func(r *http.Request) (any, error) {
		vols, err := v.Volumes(r.Context())
		if vols == nil {
			vols = []Volume{}
		}
		return vols, err
	})
	s.get("/v1/volumes/{name}", func(r *http.Request) (any, error) { return v.Volume(r.Context(), r.PathValue("name")) })
	s.mutate("/v1/volumes", func(r *http.Request) (any, error) {
		q := r.URL.Query()
		size, err := querySize(r)
		if err != nil {
			return nil, err
		}
		if q.Get("name") == "" || q.Get("pool") == "" {
			return nil, fmt.Errorf("create volume: query name=%q pool=%q: both are needed: %w", q.Get("name"), q.Get("pool"), ErrBadRequest)
		}
		return v.CreateVolume(r.Context(), q.Get("name"), q.Get("pool"), size, q["host"])
	})
	s.mutate("/v1/volumes/{name}/hosts", func(r *http.Request) (any, error) {
		return v.SetVolumeHosts(r.Context(), r.PathValue("name"), r.URL.Query()["host"])
	})
	s.mutate("/v1/volumes/{name}/resize", func(r *http.Request) (any, error) {
		size, err := querySize(r)
		if err != nil {
			return nil, err
		}
		return v.ResizeVolume(r.Context(), r.PathValue("name"), size)
	})
	s.mutate("/v1/volumes/{name}/delete", func(r *http.Request) (any, error) {
		force := false
		if f := r.URL.Query().Get("force"); f != "" {
			b, err := strconv.ParseBool(f)
			if err != nil {
				return nil, fmt.Errorf("query force=%q: want true or false: %w", f, ErrBadRequest)
			}
			force = b
		}
		return v.DeleteVolume(r.Context(), r.PathValue("name"), force)
	})
}

func querySize(r *http.Request) (int64, error) {
	n, err := queryInt(r, "size")
	if err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, fmt.Errorf("query size=%q: want the size in bytes, more than 0: %w", r.URL.Query().Get("size"), ErrBadRequest)
	}
	return n, nil
}

// mutate serves an authenticated POST answered with f's value.
func (s *Server) mutate(pattern string, f func(*http.Request) (any, error)) {
	s.mux.Handle("POST "+pattern, s.observe(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.authorize(r); err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tier0"`)
			writeError(w, err)
			return
		}
		v, err := f(r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	})))
}

// Volumes is GET /v1/volumes.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var out []Volume
	err := c.do(ctx, http.MethodGet, "/v1/volumes", false, &out)
	return out, err
}

// Volume is GET /v1/volumes/{name}.
func (c *Client) Volume(ctx context.Context, name string) (Volume, error) {
	var out Volume
	err := c.do(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(name), false, &out)
	return out, err
}

// CreateVolume is POST /v1/volumes; hosts (optional) is the allow-list.
func (c *Client) CreateVolume(ctx context.Context, name, pool string, size int64, hosts ...string) (Volume, error) {
	q := url.Values{"name": {name}, "pool": {pool}, "size": {strconv.FormatInt(size, 10)}}
	if len(hosts) > 0 {
		q["host"] = hosts
	}
	var out Volume
	err := c.do(ctx, http.MethodPost, "/v1/volumes?"+q.Encode(), true, &out)
	return out, err
}

// SetVolumeHosts is POST /v1/volumes/{name}/hosts: the volume's host
// allow-list becomes hosts (none: every host).
func (c *Client) SetVolumeHosts(ctx context.Context, name string, hosts []string) (Volume, error) {
	path := "/v1/volumes/" + url.PathEscape(name) + "/hosts"
	if len(hosts) > 0 {
		path += "?" + url.Values{"host": hosts}.Encode()
	}
	var out Volume
	err := c.do(ctx, http.MethodPost, path, true, &out)
	return out, err
}

// ResizeVolume is POST /v1/volumes/{name}/resize.
func (c *Client) ResizeVolume(ctx context.Context, name string, size int64) (Volume, error) {
	var out Volume
	err := c.do(ctx, http.MethodPost, "/v1/volumes/"+url.PathEscape(name)+"/resize?size="+strconv.FormatInt(size, 10), true, &out)
	return out, err
}

// DeleteVolume is POST /v1/volumes/{name}/delete.
func (c *Client) DeleteVolume(ctx context.Context, name string, force bool) (Volume, error) {
	path := "/v1/volumes/" + url.PathEscape(name) + "/delete"
	if force {
		path += "?force=true"
	}
	var out Volume
	err := c.do(ctx, http.MethodPost, path, true, &out)
	return out, err
}
