package api

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
)

// fakeVolumes is a Backend with volumes.
type fakeVolumes struct {
	*fakeBackend
	vols   map[string]Volume
	forced bool
}

func (f *fakeVolumes) Volumes(context.Context) ([]Volume, error) {
	var out []Volume
	for _, v := range f.vols {
		out = append(out, v)
	}
	return out, nil
}

func (f *fakeVolumes) Volume(_ context.Context, name string) (Volume, error) {
	v, ok := f.vols[name]
	if !ok {
		return Volume{}, fmt.Errorf("volume %s: %w", name, ErrNotFound)
	}
	return v, nil
}

func (f *fakeVolumes) CreateVolume(_ context.Context, name, pool string, size int64, hosts []string) (Volume, error) {
	v := Volume{Name: name, Pool: pool, Size: size, State: "creating", NSID: uint32(len(f.vols) + 1), Hosts: hosts}
	f.vols[name] = v
	return v, nil
}

func (f *fakeVolumes) SetVolumeHosts(_ context.Context, name string, hosts []string) (Volume, error) {
	v := f.vols[name]
	v.Hosts = hosts
	f.vols[name] = v
	return v, nil
}

func (f *fakeVolumes) ResizeVolume(_ context.Context, name string, size int64) (Volume, error) {
	v := f.vols[name]
	v.Size = size
	f.vols[name] = v
	return v, nil
}

func (f *fakeVolumes) DeleteVolume(_ context.Context, name string, force bool) (Volume, error) {
	if !force {
		return Volume{}, fmt.Errorf("volume %s is in use: host h connected through node A: %w", name, ErrConflict)
	}
	f.forced = true
	v := f.vols[name]
	v.State = "deleting"
	return v, nil
}

// TestVolumeEndpoints: the volume endpoints are served for a Volumer,
// mutate only with the token, carry the size and force through, and map a
// refused delete to ErrConflict.
func TestVolumeEndpoints(t *testing.T) {
	f := &fakeVolumes{fakeBackend: newFake(t), vols: map[string]Volume{}}
	srv, err := NewServer(ServerOptions{Backend: f, Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	ctx := t.Context()
	anon, c := NewClient(hs.URL, "", nil), NewClient(hs.URL, "s3cret", nil)
	if _, err := anon.CreateVolume(ctx, "v1", "a", 1<<30); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("create without the token: %v, want ErrUnauthorized", err)
	}
	v, err := c.CreateVolume(ctx, "v1", "a", 1<<30, "nqn.h1", "nqn.h2")
	if err != nil || v.Name != "v1" || v.Pool != "a" || v.Size != 1<<30 || !slices.Equal(v.Hosts, []string{"nqn.h1", "nqn.h2"}) {
		t.Fatalf("create: %+v %v", v, err)
	}
	if _, err := anon.SetVolumeHosts(ctx, "v1", nil); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("set hosts without the token: %v, want ErrUnauthorized", err)
	}
	if v, err = c.SetVolumeHosts(ctx, "v1", []string{"nqn.h3"}); err != nil || !slices.Equal(v.Hosts, []string{"nqn.h3"}) {
		t.Fatalf("set hosts: %+v %v", v, err)
	}
	if v, err = c.SetVolumeHosts(ctx, "v1", nil); err != nil || v.Hosts != nil {
		t.Fatalf("clear hosts: %+v %v", v, err)
	}
	if v, err = c.ResizeVolume(ctx, "v1", 2<<30); err != nil || v.Size != 2<<30 {
		t.Fatalf("resize: %+v %v", v, err)
	}
	if _, err := c.ResizeVolume(ctx, "v1", 0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("resize to 0: %v", err)
	}
	if vs, err := anon.Volumes(ctx); err != nil || len(vs) != 1 {
		t.Fatalf("list: %+v %v", vs, err)
	}
	if _, err := anon.Volume(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("show unknown: %v", err)
	}
	if _, err := c.DeleteVolume(ctx, "v1", false); !errors.Is(err, ErrConflict) {
		t.Fatalf("delete in use without force: %v", err)
	}
	if v, err := c.DeleteVolume(ctx, "v1", true); err != nil || v.State != "deleting" || !f.forced {
		t.Fatalf("delete with force: %+v %v", v, err)
	}
}
