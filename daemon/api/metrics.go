package api

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"tier0/daemon/cluster"
)

// Metrics is the daemon's Prometheus registry and the tier0 metrics in it.
// The control-plane gauges are set from the failover machine's view with
// SetArrays; the data-path collectors (IOBytes, IOLatency, MemberLatency,
// PathErrors) are observed by the daemon's RAID and fabric code. More
// collectors may be registered on Registry. All methods are safe for
// concurrent use.
type Metrics struct {
	Registry *prometheus.Registry

	// ArrayState is 1 for the array's current state label, 0 otherwise.
	ArrayState *prometheus.GaugeVec // array, state
	// DegradedMembers counts members not in sync.
	DegradedMembers *prometheus.GaugeVec // array
	// RebuildProgress is 0..1 per member being rebuilt or resynced.
	RebuildProgress *prometheus.GaugeVec // array, member
	// RebuildRate is the current rebuild rate in bytes per second.
	RebuildRate *prometheus.GaugeVec // array
	// Epoch is the array's fencing epoch.
	Epoch *prometheus.GaugeVec // array
	// Owned is 1 when this node owns the array.
	Owned *prometheus.GaugeVec // array
	// Failovers counts completed ownership moves by kind (failover,
	// handoff, assign).
	Failovers *prometheus.CounterVec // array, kind
	// FailoverSeconds is the time from losing the old owner (or starting
	// a planned move) to ANA optimized on the new owner.
	FailoverSeconds *prometheus.HistogramVec // kind
	// LeaseHeld is 1 while this node holds its liveness lease.
	LeaseHeld prometheus.Gauge
	// Fenced is 1 while this node has fenced itself.
	Fenced prometheus.Gauge
	// NodesUp counts nodes with a live lease.
	NodesUp prometheus.Gauge

	// IOBytes counts bytes moved per array and op (read, write).
	IOBytes *prometheus.CounterVec // array, op
	// IOLatency is the frontend request latency per array and op.
	IOLatency *prometheus.HistogramVec // array, op
	// MemberLatency is the backend request latency per member and op.
	MemberLatency *prometheus.HistogramVec // array, member, op
	// PathErrors counts failed requests per fabric path.
	PathErrors *prometheus.CounterVec // path, kind

	// APIRequests counts API calls by route pattern and status code.
	APIRequests *prometheus.CounterVec // route, code

	// ArrayFailed is 1 while the array has failed on this node (its owner):
	// more members lost than its parity; the frontend does not serve it.
	ArrayFailed *prometheus.GaugeVec // array
	// ScrubMismatches is the number of parity mismatches the array's last
	// completed scrub found (set by the owner).
	ScrubMismatches *prometheus.GaugeVec // array
	// ScrubLast is the Unix time the array's last scrub finished.
	ScrubLast *prometheus.GaugeVec // array
}

var arrayStates = []cluster.ArrayState{cluster.StateOptimal, cluster.StateDegraded, cluster.StateRebuilding, cluster.StateFailed, cluster.StateOffline}

// NewMetrics builds a fresh registry with the Go and process collectors and
// every tier0 metric.
func NewMetrics() *Metrics {
	lat := prometheus.ExponentialBuckets(20e-6, 2, 18) // 20µs .. ~2.6s
	m := &Metrics{
		Registry:        prometheus.NewRegistry(),
		ArrayState:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_array_state", Help: "1 for the array's current state."}, []string{"array", "state"}),
		DegradedMembers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_array_degraded_members", Help: "Members of the array not in sync."}, []string{"array"}),
		RebuildProgress: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_rebuild_progress_ratio", Help: "Rebuild or resync progress of a member, 0..1."}, []string{"array", "member"}),
		RebuildRate:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_rebuild_rate_bytes_per_second", Help: "Current rebuild rate."}, []string{"array"}),
		Epoch:           prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_array_epoch", Help: "Fencing epoch of the array's ownership."}, []string{"array"}),
		Owned:           prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_array_owned", Help: "1 when this node owns the array."}, []string{"array"}),
		Failovers:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tier0_failovers_total", Help: "Completed ownership moves."}, []string{"array", "kind"}),
		FailoverSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tier0_failover_duration_seconds", Help: "Owner loss (or move start) to ANA optimized.", Buckets: prometheus.ExponentialBuckets(0.05, 2, 12)}, []string{"kind"}),
		LeaseHeld:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "tier0_lease_held", Help: "1 while this node holds its liveness lease."}),
		Fenced:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "tier0_node_fenced", Help: "1 while this node has fenced itself."}),
		NodesUp:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "tier0_nodes_up", Help: "Nodes with a live lease."}),
		IOBytes:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tier0_array_io_bytes_total", Help: "Bytes read or written through the array's frontend."}, []string{"array", "op"}),
		IOLatency:       prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tier0_array_io_latency_seconds", Help: "Frontend request latency.", Buckets: lat}, []string{"array", "op"}),
		MemberLatency:   prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tier0_member_io_latency_seconds", Help: "Backend member request latency.", Buckets: lat}, []string{"array", "member", "op"}),
		PathErrors:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tier0_path_errors_total", Help: "Failed requests per fabric path."}, []string{"path", "kind"}),
		APIRequests:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tier0_api_requests_total", Help: "Management API requests."}, []string{"route", "code"}),
		ArrayFailed:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_array_failed", Help: "1 while the array has failed on its owner (more members lost than its parity) and is not served."}, []string{"array"}),
		ScrubMismatches: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_scrub_mismatches", Help: "Parity mismatches found by the array's last scrub."}, []string{"array"}),
		ScrubLast:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tier0_scrub_last_finished_seconds", Help: "Unix time the array's last scrub finished."}, []string{"array"}),
	}
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.ArrayState, m.DegradedMembers, m.RebuildProgress, m.RebuildRate, m.Epoch, m.Owned, m.Failovers, m.FailoverSeconds,
		m.LeaseHeld, m.Fenced, m.NodesUp, m.IOBytes, m.IOLatency, m.MemberLatency, m.PathErrors, m.APIRequests,
		m.ArrayFailed, m.ScrubMismatches, m.ScrubLast)
	return m
}

// SetArrays replaces the per-array control-plane gauges with the given
// view; self is this node (for tier0_array_owned). Arrays and members that
// disappeared lose their series.
func (m *Metrics) SetArrays(self string, arrays []cluster.ArrayView) {
	m.ArrayState.Reset()
	m.DegradedMembers.Reset()
	m.RebuildProgress.Reset()
	m.Epoch.Reset()
	m.Owned.Reset()
	for _, a := range arrays {
		for _, st := range arrayStates {
			v := 0.0
			if a.State == st {
				v = 1
			}
			m.ArrayState.WithLabelValues(a.Name, string(st)).Set(v)
		}
		bad := 0
		for _, mb := range a.Members {
			if mb.State != cluster.MemberOK {
				bad++
			}
			if mb.State == cluster.MemberRebuilding || mb.State == cluster.MemberResyncing {
				m.RebuildProgress.WithLabelValues(a.Name, mb.Drive).Set(float64(mb.Progress) / 100)
			}
		}
		m.DegradedMembers.WithLabelValues(a.Name).Set(float64(bad))
		m.Epoch.WithLabelValues(a.Name).Set(float64(a.Epoch))
		owned := 0.0
		if a.Owner == self {
			owned = 1
		}
		m.Owned.WithLabelValues(a.Name).Set(owned)
	}
}

// ObserveMove records a completed ownership move (a cluster.RecordEvent of
// kind failover, handoff or assign) and how long it took.
func (m *Metrics) ObserveMove(array, kind string, seconds float64) {
	m.Failovers.WithLabelValues(array, kind).Inc()
	m.FailoverSeconds.WithLabelValues(kind).Observe(seconds)
}

// ObserveRecord counts a machine's RecordEvent: ownership moves (kinds
// failover, handoff, assign) with their duration, the machine's ticks times
// tick. Other kinds are ignored.
func (m *Metrics) ObserveRecord(ev cluster.RecordEvent, tick time.Duration) {
	switch ev.Kind {
	case "failover", "handoff", "assign":
		m.ObserveMove(ev.Array, ev.Kind, (time.Duration(ev.Ticks) * tick).Seconds())
	}
}

// SetLease records this node's lease and fence state.
func (m *Metrics) SetLease(held, fenced bool) {
	m.LeaseHeld.Set(b2f(held))
	m.Fenced.Set(b2f(fenced))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// SetScrub records an array's last scrub.
func (m *Metrics) SetScrub(array string, s ScrubStatus) {
	if s.Running {
		return
	}
	m.ScrubMismatches.WithLabelValues(array).Set(float64(s.Mismatches))
	if !s.Finished.IsZero() {
		m.ScrubLast.WithLabelValues(array).Set(float64(s.Finished.UnixNano()) / 1e9)
	}
}

// SetArrayFailed records whether an array has failed on this node.
func (m *Metrics) SetArrayFailed(array string, failed bool) {
	m.ArrayFailed.WithLabelValues(array).Set(b2f(failed))
}
