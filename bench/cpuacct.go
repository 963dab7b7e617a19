package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// userHZ is the unit of the CPU times in /proc/PID/stat (USER_HZ, 100 on
// every Linux architecture Go supports).
const userHZ = 100

// ProcCPU is a process's CPU time so far, from /proc/PID/stat.
type ProcCPU struct {
	UserS, SystemS float64
}

// ParseProcStat reads utime and stime (fields 14 and 15) from the text of
// /proc/PID/stat. The command name (field 2) may hold spaces and
// parentheses: fields are counted after its last ')'.
func ParseProcStat(stat string) (ProcCPU, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return ProcCPU{}, fmt.Errorf("/proc stat %q: no command name in parentheses", oneLineStat(stat))
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return ProcCPU{}, fmt.Errorf("/proc stat %q: %d fields after the command name, want at least 13", oneLineStat(stat), len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return ProcCPU{}, fmt.Errorf("/proc stat %q: utime %q, stime %q: want clock ticks", oneLineStat(stat), f[11], f[12])
	}
	return ProcCPU{UserS: float64(u) / userHZ, SystemS: float64(s) / userHZ}, nil
}

func oneLineStat(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return s
}

// ReadProcCPU reads pid's CPU time ("self" for this process).
func ReadProcCPU(pid string) (ProcCPU, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return ProcCPU{}, err
	}
	return ParseProcStat(string(bytes.TrimSpace(b)))
}

// Roles of the processes in a measured path.
const (
	// RoleTier0d: a node's tier0d (backend target, backend host, RAID
	// and frontend target in one process).
	RoleTier0d = "tier0d"
	// RoleHost: the application side: the load generator with its
	// NVMe/TCP host and multipath (or, on the raw layer, its file I/O).
	RoleHost = "host"
)

// CPUUse is one process's CPU time over a measurement.
type CPUUse struct {
	// Process names it ("tier0d A", "validate").
	Process string `json:"process"`
	// Role says what it does in the measured path.
	Role    string  `json:"role,omitempty"`
	UserS   float64 `json:"user_s"`
	SystemS float64 `json:"system_s"`
}

// Seconds is user plus system CPU time.
func (u CPUUse) Seconds() float64 { return u.UserS + u.SystemS }

// CPUCost is the CPU time processes spent while a measurement moved
// Bytes in Ops operations over WallS seconds (all its repetitions).
type CPUCost struct {
	Processes []CPUUse `json:"processes"`
	Bytes     int64    `json:"bytes"`
	Ops       int64    `json:"ops"`
	WallS     float64  `json:"wall_s"`
}

// Seconds is the CPU time of the processes whose role is role (every
// process when role is empty).
func (c CPUCost) Seconds(role string) float64 {
	var s float64
	for _, p := range c.Processes {
		if role == "" || p.Role == role {
			s += p.Seconds()
		}
	}
	return s
}

// PerGiB is CPU-seconds per GiB moved (processes of role); 0 when nothing
// moved.
func (c CPUCost) PerGiB(role string) float64 {
	if c.Bytes <= 0 {
		return 0
	}
	return c.Seconds(role) / (float64(c.Bytes) / (1 << 30))
}

// PerMillionOps is CPU-seconds per million operations.
func (c CPUCost) PerMillionOps(role string) float64 {
	if c.Ops <= 0 {
		return 0
	}
	return c.Seconds(role) / (float64(c.Ops) / 1e6)
}

// Cores is the average number of cores the processes of role kept busy.
func (c CPUCost) Cores(role string) float64 {
	if c.WallS <= 0 {
		return 0
	}
	return c.Seconds(role) / c.WallS
}

// Net is c less what the same processes spend idle: each process's CPU
// time reduced by its rate in idle (CPU-seconds per second over idle's
// wall time) times c's wall time, never below zero. A nil or empty idle
// leaves c as it is. What remains is the cost of the measured work, not
// of heartbeats, leases and polls.
func (c CPUCost) Net(idle *CPUCost) CPUCost {
	if idle == nil || idle.WallS <= 0 {
		return c
	}
	out := c
	out.Processes = nil
	for _, p := range c.Processes {
		var rate float64
		for _, q := range idle.Processes {
			if q.Process == p.Process {
				rate = q.Seconds() / idle.WallS
			}
		}
		if tot := p.Seconds(); tot > 0 {
			keep := max(0, tot-rate*c.WallS) / tot
			p.UserS, p.SystemS = p.UserS*keep, p.SystemS*keep
		}
		out.Processes = append(out.Processes, p)
	}
	return out
}

// IdleExpected is what role's processes of c would have spent over c's
// wall time at the rate they spend idle (CPU-seconds); 0 without idle.
func (c CPUCost) IdleExpected(idle *CPUCost, role string) float64 {
	if idle == nil || idle.WallS <= 0 {
		return 0
	}
	var sum float64
	for _, p := range c.Processes {
		if role != "" && p.Role != role {
			continue
		}
		for _, q := range idle.Processes {
			if q.Process == p.Process {
				sum += q.Seconds() / idle.WallS * c.WallS
			}
		}
	}
	return sum
}

// MinAboveIdle is how far a role's CPU time must rise above its idle
// expectation (as a share of it) before the difference is taken as the
// cost of the work: idle costs (heartbeats, lease renewals, raft ticks)
// vary by more than a tenth from one minute to the next on a shared
// machine, so a smaller excess is noise.
const MinAboveIdle = 0.25

// Resolved reports whether role's work cost in c stands clearly above its
// idle cost (see MinAboveIdle); without an idle measurement it always does.
func (c CPUCost) Resolved(idle *CPUCost, role string) bool {
	exp := c.IdleExpected(idle, role)
	if exp <= 0 {
		return c.Seconds(role) > 0
	}
	return c.Seconds(role)-exp >= MinAboveIdle*exp
}

// Add accumulates o into c (per process name).
func (c *CPUCost) Add(o CPUCost) {
	c.Bytes += o.Bytes
	c.Ops += o.Ops
	c.WallS += o.WallS
	for _, p := range o.Processes {
		found := false
		for i := range c.Processes {
			if c.Processes[i].Process == p.Process {
				c.Processes[i].UserS += p.UserS
				c.Processes[i].SystemS += p.SystemS
				found = true
				break
			}
		}
		if !found {
			c.Processes = append(c.Processes, p)
		}
	}
}

// CPUWatch takes CPU readings of a set of processes, so that the CPU time
// they spend between two readings can be attributed to a measurement.
type CPUWatch struct {
	mu    sync.Mutex
	procs []watched
	read  func(pid string) (ProcCPU, error)
}

type watched struct {
	name, role, pid string
}

// NewCPUWatch watches nothing yet; Watch adds processes.
func NewCPUWatch() *CPUWatch { return &CPUWatch{read: ReadProcCPU} }

// Watch adds a process: pid ("self" for this one), a name and its role.
func (w *CPUWatch) Watch(pid, name, role string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.procs = append(w.procs, watched{name: name, role: role, pid: pid})
}

// CPUReading is one reading of every watched process.
type CPUReading map[string]ProcCPU

// Read takes a reading; a process that cannot be read (it exited) is
// left out, and so counts nothing for the interval.
func (w *CPUWatch) Read() CPUReading {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := CPUReading{}
	for _, p := range w.procs {
		if c, err := w.read(p.pid); err == nil {
			r[p.pid] = c
		}
	}
	return r
}

// Since is the CPU time each watched process spent between the readings
// from and to (processes present in both).
func (w *CPUWatch) Since(from, to CPUReading) []CPUUse {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []CPUUse
	for _, p := range w.procs {
		a, ok1 := from[p.pid]
		b, ok2 := to[p.pid]
		if !ok1 || !ok2 {
			continue
		}
		out = append(out, CPUUse{Process: p.name, Role: p.role, UserS: max(0, b.UserS-a.UserS), SystemS: max(0, b.SystemS-a.SystemS)})
	}
	return out
}
