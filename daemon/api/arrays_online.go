package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Online array endpoints (docs/VOLUMES.md, "Pools created online"),
// served when the Backend is an ArrayProvisioner:
//
//	POST /v1/arrays?name=N&level=raid5|raid6&members=K[&home=NODE][&chunk_kib=C][&no_volume=true]
//	                                          create an array on free drives [token]
//	POST /v1/arrays/{name}/delete[?force=true] delete an online array        [token]
//
// Create answers once the desired state is written: every node then
// serves the array and the coordinator has its home assemble it (`tier0
// array show` follows it). Delete answers 409 naming the pool's volumes
// and the hosts connected to or holding reservations on it unless force;
// it answers once the array is gone from every live node and its drives
// are wiped (phase deleted, or deleting with Unwiped naming the drives of
// nodes that are down), or with the phase it reached when that takes
// longer.

// OnlineArray is an array created online as the API shows it.
type OnlineArray struct {
	Name     string   `json:"name"`
	Level    string   `json:"level"`
	ChunkKiB int      `json:"chunk_kib"`
	Home     string   `json:"home"`
	Members  []string `json:"members"`
	// Phase is active, deleting or deleted.
	Phase   string   `json:"phase"`
	Stopped []string `json:"stopped,omitempty"`
	Wiped   []string `json:"wiped,omitempty"`
	// Unwiped (deleting) are the member drives, "DRIVE (node NODE)",
	// whose node was down during the delete: every live node is done, and
	// each of those wipes its drive when it returns; the record (and the
	// array's name and those drives) stays taken until then.
	Unwiped []string  `json:"unwiped,omitempty"`
	Created time.Time `json:"created,omitzero"`
	// Volumes are the pool's volumes (a delete removed them with force).
	Volumes []string `json:"volumes,omitempty"`
	// Holders are the hosts connected to or holding reservations on the
	// pool's namespaces (a refused or forced delete).
	Holders []VolumeHolder `json:"holders,omitempty"`
}

// ArrayCreate is what POST /v1/arrays asks for.
type ArrayCreate struct {
	Name     string `json:"name"`
	Level    string `json:"level"`
	Members  int    `json:"members"`
	Home     string `json:"home,omitempty"`
	ChunkKiB int    `json:"chunk_kib,omitempty"`
	NoVolume bool   `json:"no_volume,omitempty"`
}

// ArrayProvisioner is the optional part of a Backend that creates and
// deletes arrays online; a Backend without it answers 404 there.
type ArrayProvisioner interface {
	CreateArray(ctx context.Context, req ArrayCreate) (OnlineArray, error)
	DeleteArray(ctx context.Context, name string, force bool) (OnlineArray, error)
}

func (s *Server) arrayRoutes(p ArrayProvisioner) {
	s.mutate("/v1/arrays", func(r *http.Request) (any, error) {
		q := r.URL.Query()
		req := ArrayCreate{Name: q.Get("name"), Level: q.Get("level"), Home: q.Get("home")}
		if req.Name == "" {
			return nil, fmt.Errorf("create array: query name is needed: %w", ErrBadRequest)
		}
		m, err := queryInt(r, "members")
		if err != nil {
			return nil, err
		}
		c, err := queryInt(r, "chunk_kib")
		if err != nil {
			return nil, err
		}
		req.Members, req.ChunkKiB = int(min(m, 1<<20)), int(min(c, 1<<20))
		if req.NoVolume, err = queryBool(r, "no_volume"); err != nil {
			return nil, err
		}
		return p.CreateArray(r.Context(), req)
	})
	s.mutate("/v1/arrays/{name}/delete", func(r *http.Request) (any, error) {
		force, err := queryBool(r, "force")
		if err != nil {
			return nil, err
		}
		return p.DeleteArray(r.Context(), r.PathValue("name"), force)
	})
}

func queryBool(r *http.Request, key string) (bool, error) {
	v := r.URL.Query().Get(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("query %s=%q: want true or false: %w", key, v, ErrBadRequest)
	}
	return b, nil
}

// CreateArray is POST /v1/arrays.
func (c *Client) CreateArray(ctx context.Context, req ArrayCreate) (OnlineArray, error) {
	q := url.Values{"name": {req.Name}, "level": {req.Level}, "members": {strconv.Itoa(req.Members)}}
	if req.Home != "" {
		q.Set("home", req.Home)
	}
	if req.ChunkKiB != 0 {
		q.Set("chunk_kib", strconv.Itoa(req.ChunkKiB))
	}
	if req.NoVolume {
		q.Set("no_volume", "true")
	}
	var out OnlineArray
	err := c.do(ctx, http.MethodPost, "/v1/arrays?"+q.Encode(), true, &out)
	return out, err
}

// DeleteArray is POST /v1/arrays/{name}/delete.
func (c *Client) DeleteArray(ctx context.Context, name string, force bool) (OnlineArray, error) {
	path := "/v1/arrays/" + url.PathEscape(name) + "/delete"
	if force {
		path += "?force=true"
	}
	var out OnlineArray
	err := c.do(ctx, http.MethodPost, path, true, &out)
	return out, err
}
