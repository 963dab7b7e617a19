package api

import (
	"context"
	"errors"
	"time"

	"tier0/daemon/cluster"
)

// Sentinel errors. A Backend returns them (wrapped) to choose the status
// code; the Client returns them (wrapped) from the status code it got.
var (
	// ErrNotFound (404): the named array, node or drive does not exist.
	ErrNotFound = errors.New("not found")
	// ErrBadRequest (400): the request is malformed or names a value that
	// is not allowed.
	ErrBadRequest = errors.New("bad request")
	// ErrConflict (409): the request clashes with the current state (for
	// example draining the last eligible node).
	ErrConflict = errors.New("conflict")
	// ErrUnauthorized (401): a mutating call without the right token.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrUnavailable (503): the daemon cannot answer now (store
	// unreachable, not started).
	ErrUnavailable = errors.New("unavailable")
)

// Status is the cluster as one node sees it.
type Status struct {
	Node        string              `json:"node"` // the answering node
	Time        time.Time           `json:"time"`
	Coordinator string              `json:"coordinator,omitempty"`
	Lease       string              `json:"lease"` // this node's: held, lost
	Nodes       []cluster.NodeView  `json:"nodes"`
	Arrays      []cluster.ArrayView `json:"arrays"`
	// Owners is what each array's owner reports about the RAID it runs
	// (absent for arrays nobody runs).
	Owners []OwnerReport `json:"owners,omitempty"`
}

// OwnerReport is an array as its owner's RAID engine sees it, published by
// the owner in the store every second.
type OwnerReport struct {
	Array   string       `json:"array"`
	Owner   string       `json:"owner"`
	Epoch   uint64       `json:"epoch"`
	Serving bool         `json:"serving"` // ANA optimized on the owner
	State   string       `json:"state"`   // RAID state: optimal, degraded, failed, fenced, stopped
	Failed  bool         `json:"failed,omitempty"`
	Reason  string       `json:"reason,omitempty"` // why failed (or not optimal)
	Scrub   *ScrubStatus `json:"scrub,omitempty"`
	Time    time.Time    `json:"time"`
}

// ScrubStatus is the current or last parity scrub of an array on its owner.
type ScrubStatus struct {
	Running  bool      `json:"running"`
	Repair   bool      `json:"repair"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	// Mismatches counts stripes whose parity did not match; Repaired, how
	// many of them were fixed.
	Mismatches int64 `json:"mismatches"`
	Repaired   int64 `json:"repaired"`
	// Stripes are the first mismatching stripes (at most 16).
	Stripes []int64 `json:"stripes,omitempty"`
	// Error says why the run stopped early ("" when it completed).
	Error string `json:"error,omitempty"`
}

// Array is one array's state (the failover machine's view).
type Array = cluster.ArrayView

// Event is one entry of the failover/event log: the store's own entry
// (store.Event), defined once in cluster.
type Event = cluster.LogEntry

// NodeHealth is GET /v1/node/health, the shape Slurm's health check reads:
//
//	{"node":"B","daemon":"ok","fenced":false,"lease":"held","drives_missing":[],
//	 "arrays":[{"name":"a","state":"optimal","owner":"A","path_usable":true}],
//	 "rebuild_active":false,"redundant":true}
type NodeHealth struct {
	Node          string        `json:"node"`
	Daemon        string        `json:"daemon"` // ok, starting, degraded
	Fenced        bool          `json:"fenced"`
	Lease         string        `json:"lease"` // held, lost
	DrivesMissing []string      `json:"drives_missing"`
	Arrays        []ArrayHealth `json:"arrays"`
	RebuildActive bool          `json:"rebuild_active"`
	Redundant     bool          `json:"redundant"`
}

// ArrayHealth is one array as seen from the reporting node.
type ArrayHealth struct {
	Name  string `json:"name"`
	State string `json:"state"` // optimal, degraded, rebuilding, failed, offline
	Owner string `json:"owner"`
	// PathUsable: I/O to the array from this node has a usable path.
	PathUsable bool `json:"path_usable"`
}

// Backend is what the server asks; the daemon implements it. Every method
// may be called from many goroutines at once and must honour ctx. Errors
// wrapping ErrNotFound, ErrBadRequest, ErrConflict or ErrUnavailable choose
// the status code; anything else is a 500. Mutating methods return once the
// request is recorded (in the store), not once the move is complete.
type Backend interface {
	Status(ctx context.Context) (Status, error)
	Arrays(ctx context.Context) ([]Array, error)
	Array(ctx context.Context, name string) (Array, error)
	Events(ctx context.Context, after int64, limit int) ([]Event, error)
	NodeHealth(ctx context.Context) (NodeHealth, error)
	Drain(ctx context.Context, node string) error
	Undrain(ctx context.Context, node string) error
	FailDrive(ctx context.Context, drive string) error
	ReplaceDrive(ctx context.Context, drive string) error
}

// Scrubber is the optional part of a Backend that serves
// POST /v1/arrays/{name}/scrub; a Backend without it answers 404.
type Scrubber interface {
	// ScrubArray asks the array's owner to check every stripe's parity
	// (repair: and fix mismatches). It returns once the request is
	// recorded; findings appear in Status().Owners and the event log.
	ScrubArray(ctx context.Context, name string, repair bool) error
}
