package cluster

import "time"

// LogEntry is one entry of the append-only failover/event log: the store
// writes it (store.Event), the API serves it and the CLI reads it
// (api.Event). Defined here, the one package both may import, so that
// the two names are one type.
type LogEntry struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"`
	Array    string    `json:"array,omitempty"`
	Node     string    `json:"node,omitempty"`
	From     string    `json:"from,omitempty"`
	To       string    `json:"to,omitempty"`
	Epoch    uint64    `json:"epoch,omitempty"`
	Duration float64   `json:"duration_s,omitempty"` // failover duration
	Message  string    `json:"message,omitempty"`
	Revision int64     `json:"revision"` // set by the store; orders the log
}
