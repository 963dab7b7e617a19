package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Schema is the version tag of the results JSON. A reader accepts exactly
// this value; a change that breaks readers gets a new version.
const Schema = "tier0.bench/v1"

// ErrSchema: a results file is not tier0.bench/v1 JSON.
var ErrSchema = errors.New("bench: not a tier0.bench/v1 results file")

// Results is everything one validation or bench run produced: the document
// the reports are made from.
type Results struct {
	Schema       string          `json:"schema"`
	Run          RunInfo         `json:"run"`
	Environment  Environment     `json:"environment"`
	Measurements []Measurement   `json:"measurements"`
	Series       []TimeSeries    `json:"series,omitempty"`
	Failover     *FailoverRecord `json:"failover,omitempty"`
	Rebuilds     []RebuildRecord `json:"rebuilds,omitempty"`
	GDS          *GDSSlot        `json:"gds,omitempty"`
	Checks       []Check         `json:"checks"`
}

// RunInfo is the run's metadata.
type RunInfo struct {
	ID       string    `json:"id"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Site is the site config's name ("weizmann-5node", "local-5node").
	Site string `json:"site"`
	// Mode is how the cluster ran: "local" (processes on loopback) or
	// "cluster".
	Mode string `json:"mode,omitempty"`
	// Topology in words, e.g. "5 nodes x 4 drives, 5 x RAID-5 3+1".
	Topology string   `json:"topology,omitempty"`
	Notes    []string `json:"notes,omitempty"`
	// Repeat is how many times each scenario ran (0 or 1: once).
	Repeat int `json:"repeat,omitempty"`
	// Arrays are the arrays' shapes (for the theoretical figures).
	Arrays []ArrayShape `json:"arrays,omitempty"`
	// IdleCPU is what the watched processes spent with the cluster up and
	// no load (subtracted from each measurement's CPU cost, CPUCost.Net).
	IdleCPU *CPUCost `json:"idle_cpu,omitempty"`
	// Model describes the drive and link performance model the local
	// cluster ran under; nil when the drives ran unshaped (a real
	// cluster, or a local site without drives.*.model).
	Model *ModelInfo `json:"model,omitempty"`
}

// ArrayShape is one array's RAID geometry.
type ArrayShape struct {
	Name   string `json:"name"`
	Level  string `json:"level"`
	Data   int    `json:"data"`
	Parity int    `json:"parity"`
}

// ModelInfo is the performance model of a local run: every drive shaped
// to Drive (already scaled), every node's links to LinkBytesPerS.
type ModelInfo struct {
	// Profile names the drive profile ("micron-7450-pro-3.84tb"); Source
	// where its figures come from.
	Profile string `json:"profile"`
	Source  string `json:"source,omitempty"`
	// Scale is the factor every published figure was multiplied by.
	Scale float64 `json:"scale"`
	// Drive is the scaled per-drive model.
	Drive DriveFigures `json:"drive"`
	// LinkBytesPerS is each node's modelled link (0: not modelled).
	LinkBytesPerS float64 `json:"link_bytes_per_s,omitempty"`
	// How says how the model is applied (which layer it shapes).
	How string `json:"how,omitempty"`
	// Calibration is how the scale was chosen at start-up (bench/model.go).
	Calibration *ModelCalibration `json:"calibration,omitempty"`
}

// DriveFigures are a drive's bandwidth, IOPS and latency for reads and
// writes.
type DriveFigures struct {
	ReadBytesPerS  float64 `json:"read_bytes_per_s"`
	WriteBytesPerS float64 `json:"write_bytes_per_s"`
	ReadIOPS       float64 `json:"read_iops"`
	WriteIOPS      float64 `json:"write_iops"`
	ReadLatNs      int64   `json:"read_lat_ns"`
	WriteLatNs     int64   `json:"write_lat_ns"`
}

// Measurement is one scenario's figures on one layer in one state.
type Measurement struct {
	Layer    Layer  `json:"layer"`
	State    State  `json:"state"`
	Scenario string `json:"scenario"`
	// Label is the state in words ("healthy", "one node lost").
	Label string `json:"label,omitempty"`
	// Tool produced the figures: ToolLoadgen, ToolFio or ToolGdsio.
	Tool       string         `json:"tool"`
	Pattern    Pattern        `json:"pattern,omitempty"`
	IOSize     int            `json:"io_size"`
	QueueDepth int            `json:"queue_depth"`
	Targets    []string       `json:"targets,omitempty"`
	DurationS  float64        `json:"duration_s"`
	Bytes      int64          `json:"bytes"`
	Ops        int64          `json:"ops"`
	Errors     int64          `json:"errors"`
	BytesPerS  float64        `json:"bytes_per_s"`
	IOPS       float64        `json:"iops"`
	Latency    LatencySummary `json:"latency"`
	Verify     *VerifyCounts  `json:"verify,omitempty"`
	FirstError *ErrorRecord   `json:"first_error,omitempty"`
	// SeriesID names the TimeSeries recorded with it, if any.
	SeriesID string `json:"series,omitempty"`
	// Runs are the repetitions' figures when the scenario ran more than
	// once (see Combine); the headline figures above are then their
	// medians, and Spread gives the range.
	Runs []RunFigures `json:"runs,omitempty"`
	// CPU is the CPU time the processes spent over the measurement (all
	// repetitions), when it was recorded.
	CPU *CPUCost `json:"cpu,omitempty"`
}

// GiBPerS is the throughput in GiB/s, the seed's unit.
func (m Measurement) GiBPerS() float64 { return m.BytesPerS / (1 << 30) }

// TimeSeries is throughput and latency per interval through a run.
type TimeSeries struct {
	ID        string        `json:"id"`
	Layer     Layer         `json:"layer,omitempty"`
	State     State         `json:"state,omitempty"`
	Scenario  string        `json:"scenario,omitempty"`
	Start     time.Time     `json:"start"`
	IntervalS float64       `json:"interval_s"`
	Points    []SeriesPoint `json:"points"`
	// Markers are events on the time axis (node killed, first I/O on the
	// moved array, rebuild start).
	Markers []Marker `json:"markers,omitempty"`
}

// SeriesPoint is one interval; T is its start in seconds from Start.
type SeriesPoint struct {
	T         float64 `json:"t"`
	BytesPerS float64 `json:"bytes_per_s"`
	IOPS      float64 `json:"iops"`
	MeanLatNs int64   `json:"mean_lat_ns"`
	P99LatNs  int64   `json:"p99_lat_ns"`
	Errors    int64   `json:"errors"`
}

// Marker is a labelled instant.
type Marker struct {
	At    time.Time `json:"at"`
	Label string    `json:"label"`
}

// Mark adds a marker to the series.
func (ts *TimeSeries) Mark(at time.Time, label string) {
	ts.Markers = append(ts.Markers, Marker{At: at, Label: label})
}

// FailoverRecord is what the node-loss test saw.
type FailoverRecord struct {
	// Node is the node that was killed, KilledAt when.
	Node     string    `json:"node"`
	KilledAt time.Time `json:"killed_at"`
	// FirstIOAt is when the first I/O completed on the moved array (the
	// array the killed node owned) after the kill; Duration is
	// FirstIOAt - KilledAt.
	FirstIOAt time.Time     `json:"first_io_at"`
	Duration  time.Duration `json:"duration_ns"`
	// Arrays holds, per array, where it ran before and after and what the
	// verification after the failover found.
	Arrays []ArrayFailover `json:"arrays,omitempty"`
	// SeriesID names the time series recorded through the failover.
	SeriesID string `json:"series,omitempty"`
}

// FailoverFrom starts a FailoverRecord from the mark a load run made when
// node was killed: KilledAt is the mark, FirstIOAt the completion of the
// first I/O issued after it on movedTarget (the frontend of the array the
// node owned). ok is false when no such I/O completed; the record then has
// a zero FirstIOAt and Duration.
func FailoverFrom(node string, kill MarkResult, movedTarget, seriesID string) (rec FailoverRecord, ok bool) {
	rec = FailoverRecord{Node: node, KilledAt: kill.At, SeriesID: seriesID}
	for _, t := range kill.Targets {
		if t.ID == movedTarget && !t.FirstIssued.IsZero() {
			rec.FirstIOAt = t.FirstIssued
			rec.Duration = t.FirstIssued.Sub(kill.At)
			return rec, true
		}
	}
	return rec, false
}

// ArrayFailover is one array's part of the failover.
type ArrayFailover struct {
	Array string `json:"array"`
	From  string `json:"from"`
	To    string `json:"to"`
	// Moved: the array changed owner (the killed node owned it);
	// otherwise it stayed and ran degraded.
	Moved    bool          `json:"moved"`
	Degraded bool          `json:"degraded"`
	Stall    time.Duration `json:"stall_ns"`
	Verify   VerifyCounts  `json:"verify"`
}

// RebuildRecord is one array's rebuild after the node came back.
type RebuildRecord struct {
	Array   string          `json:"array"`
	Start   time.Time       `json:"start"`
	End     time.Time       `json:"end"`
	Bytes   int64           `json:"bytes"`
	Samples []RebuildSample `json:"samples,omitempty"`
}

// Duration of the rebuild; zero if it has not ended.
func (r RebuildRecord) Duration() time.Duration {
	if r.End.IsZero() {
		return 0
	}
	return r.End.Sub(r.Start)
}

// AddSample records that done bytes were rebuilt by at.
func (r *RebuildRecord) AddSample(at time.Time, done int64) {
	r.Samples = append(r.Samples, RebuildSample{At: at, DoneBytes: done})
}

// RebuildSample is one progress reading.
type RebuildSample struct {
	At        time.Time `json:"at"`
	DoneBytes int64     `json:"done_bytes"`
}

// GDSSlot holds the GPUDirect Storage read result. The gds package fills
// Verdict with its own JSON (gds.Verdict); bench keeps it opaque so the two
// packages stay independent.
type GDSSlot struct {
	// Status: "pass", "fail" or "not-run"; Reason says why when not pass.
	Status  CheckStatus     `json:"status"`
	Reason  string          `json:"reason,omitempty"`
	Verdict json.RawMessage `json:"verdict,omitempty"`
	// Mount is the tier0 volume the check read from.
	Mount *GDSMount `json:"mount,omitempty"`
	// Libraries are the cuFile and CUDA libraries the check loaded and the
	// nvidia-fs module it found, with versions; StandIn, when set, says
	// why the verdict is not a hardware proof (overridden or missing
	// libraries or kernel files).
	Libraries []LoadedLib `json:"libraries,omitempty"`
	StandIn   string      `json:"stand_in,omitempty"`
}

// GDSMount is the file system the GPUDirect check read from.
type GDSMount struct {
	Dir        string `json:"dir"`
	MountPoint string `json:"mount_point,omitempty"`
	Source     string `json:"source,omitempty"`
	FSType     string `json:"fstype,omitempty"`
}

// LoadedLib is a library (or kernel module) a check ran on.
type LoadedLib struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Version string `json:"version,omitempty"`
}

// SetVerdict stores v (anything JSON-encodable) as the slot's verdict.
func (g *GDSSlot) SetVerdict(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding the GDS verdict %T: %w", v, err)
	}
	g.Verdict = b
	return nil
}

// CheckStatus is the outcome of a check.
type CheckStatus string

// Check outcomes. NotRun always carries a reason and is never shown as a
// pass.
const (
	Pass   CheckStatus = "pass"
	Fail   CheckStatus = "fail"
	NotRun CheckStatus = "not-run"
)

// Check is one named pass/fail statement of the validation.
type Check struct {
	Name   string      `json:"name"`
	Status CheckStatus `json:"status"`
	Reason string      `json:"reason,omitempty"`
}

// NewResults starts a results document for site, stamped with started.
func NewResults(id, site string, started time.Time, env Environment) *Results {
	return &Results{Schema: Schema, Run: RunInfo{ID: id, Site: site, Started: started}, Environment: env}
}

// Add appends m, replacing an earlier measurement with the same layer,
// state, scenario and tool.
func (r *Results) Add(m Measurement) {
	for i, o := range r.Measurements {
		if o.Layer == m.Layer && o.State == m.State && o.Scenario == m.Scenario && o.Tool == m.Tool {
			r.Measurements[i] = m
			return
		}
	}
	r.Measurements = append(r.Measurements, m)
}

// Find returns the first measurement with that key (any tool).
func (r *Results) Find(layer Layer, state State, scenario string) (Measurement, bool) {
	for _, m := range r.Measurements {
		if m.Layer == layer && m.State == state && m.Scenario == scenario {
			return m, true
		}
	}
	return Measurement{}, false
}

// AddSeries appends ts, replacing one with the same ID.
func (r *Results) AddSeries(ts TimeSeries) {
	for i, o := range r.Series {
		if o.ID == ts.ID {
			r.Series[i] = ts
			return
		}
	}
	r.Series = append(r.Series, ts)
}

// SeriesByID finds a time series.
func (r *Results) SeriesByID(id string) (TimeSeries, bool) {
	for _, s := range r.Series {
		if s.ID == id {
			return s, true
		}
	}
	return TimeSeries{}, false
}

// AddCheck records a check, replacing one with the same name. A not-run or
// failed check without a reason gets "no reason given" so that it can never
// look like a silent pass.
func (r *Results) AddCheck(name string, status CheckStatus, reason string) {
	if status != Pass && reason == "" {
		reason = "no reason given"
	}
	c := Check{Name: name, Status: status, Reason: reason}
	for i, o := range r.Checks {
		if o.Name == name {
			r.Checks[i] = c
			return
		}
	}
	r.Checks = append(r.Checks, c)
}

// Encode writes r as indented JSON.
func (r *Results) Encode(w io.Writer) error {
	if r.Schema == "" {
		r.Schema = Schema
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Decode reads a results document and checks its schema.
func Decode(rd io.Reader) (*Results, error) {
	var r Results
	dec := json.NewDecoder(rd)
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("decoding results JSON: %v: %w", err, ErrSchema)
	}
	if r.Schema != Schema {
		return nil, fmt.Errorf("schema %q, want %q (was it written by another tier0 version?): %w", r.Schema, Schema, ErrSchema)
	}
	for i, c := range r.Checks {
		switch c.Status {
		case Pass, Fail, NotRun:
		default:
			return nil, fmt.Errorf("check %d %q has status %q, want pass, fail or not-run: %w", i, c.Name, c.Status, ErrSchema)
		}
	}
	return &r, nil
}

// WriteFile writes r to path atomically (temporary file, then rename).
func WriteFile(path string, r *Results) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".results-*.json")
	if err != nil {
		return fmt.Errorf("writing results %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := r.Encode(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("writing results %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing results %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing results %s: %w", path, err)
	}
	return nil
}

// ReadFile reads and checks a results file.
func ReadFile(path string) (*Results, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading results: %w", err)
	}
	defer f.Close()
	r, err := Decode(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
