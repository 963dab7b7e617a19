package bench

import (
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CPULimits is what this process may use of the machine's CPUs: the CPUs
// of its affinity mask (sched_getaffinity) and its cgroup's CPU quota
// (cgroup v2 cpu.max, or v1 cpu.cfs_quota_us / cpu.cfs_period_us, the
// smallest along the cgroup's ancestors). A host's core count says
// nothing about a run confined to two of them.
type CPULimits struct {
	// Affinity is the number of CPUs in the affinity mask.
	Affinity int `json:"affinity"`
	// Quota is the cgroup CPU quota in cores (0: none); QuotaSource is
	// the file it came from.
	Quota       float64 `json:"quota_cores,omitempty"`
	QuotaSource string  `json:"quota_source,omitempty"`
	// Usable is min(Affinity, Quota): the cores the run may keep busy.
	Usable float64 `json:"usable"`
}

// String says it in words: "2 CPUs (affinity 2; cgroup quota 1.5 cores)".
func (l CPULimits) String() string {
	s := fmt.Sprintf("%s CPUs (affinity %d", trimFloat(l.Usable), l.Affinity)
	if l.Quota > 0 {
		s += fmt.Sprintf("; cgroup quota %s cores from %s", trimFloat(l.Quota), l.QuotaSource)
	} else {
		s += "; no cgroup CPU quota"
	}
	return s + ")"
}

func trimFloat(v float64) string {
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

// ReadCPULimits reads this process's limits.
func ReadCPULimits() (CPULimits, error) {
	var set unix.CPUSet
	aff := 0
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		aff = set.Count()
	}
	cg, _ := os.ReadFile("/proc/self/cgroup")
	return cpuLimits("/sys/fs/cgroup", string(cg), aff)
}

// cpuLimits computes the limits from the cgroup file system under root,
// the contents of /proc/self/cgroup and the affinity count.
func cpuLimits(root, selfCgroup string, affinity int) (CPULimits, error) {
	l := CPULimits{Affinity: affinity}
	v2, v1 := cgroupPaths(selfCgroup)
	var firstErr error
	consider := func(q float64, src string, err error) {
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if q > 0 && (l.Quota == 0 || q < l.Quota) {
			l.Quota, l.QuotaSource = q, src
		}
	}
	// Every ancestor's limit applies too: walk up to the root.
	if v2 != "" {
		for p := v2; ; p = path.Dir(p) {
			f := filepath.Join(root, p, "cpu.max")
			if b, err := os.ReadFile(f); err == nil {
				q, err := ParseCPUMax(string(b))
				consider(q, f, err)
			}
			if p == "/" || p == "." {
				break
			}
		}
	}
	if v1 != "" {
		for p := v1; ; p = path.Dir(p) {
			dir := filepath.Join(root, "cpu", p)
			qb, qerr := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
			pb, perr := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
			if qerr == nil && perr == nil {
				q, err := ParseCFSQuota(string(qb), string(pb))
				consider(q, filepath.Join(dir, "cpu.cfs_quota_us"), err)
			}
			if p == "/" || p == "." {
				break
			}
		}
	}
	l.Usable = float64(l.Affinity)
	if l.Quota > 0 && (l.Usable == 0 || l.Quota < l.Usable) {
		l.Usable = l.Quota
	}
	return l, firstErr
}

// cgroupPaths finds this process's cgroup v2 path ("0::/x") and its v1
// cpu controller path ("N:cpu,cpuacct:/x") in /proc/self/cgroup.
func cgroupPaths(selfCgroup string) (v2, v1cpu string) {
	for _, line := range strings.Split(selfCgroup, "\n") {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpu" {
				v1cpu = parts[2]
			}
		}
	}
	return v2, v1cpu
}

// ParseCPUMax parses a cgroup v2 cpu.max ("max 100000" or "150000
// 100000") into cores (0: no limit).
func ParseCPUMax(s string) (float64, error) {
	f := strings.Fields(s)
	if len(f) == 0 || len(f) > 2 {
		return 0, fmt.Errorf("cpu.max %q: want \"QUOTA PERIOD\" or \"max PERIOD\"", strings.TrimSpace(s))
	}
	if f[0] == "max" {
		return 0, nil
	}
	period := "100000"
	if len(f) == 2 {
		period = f[1]
	}
	return ParseCFSQuota(f[0], period)
}

// ParseCFSQuota turns a quota and period in microseconds (cgroup v1
// cpu.cfs_quota_us, -1 for none, and cpu.cfs_period_us) into cores.
func ParseCFSQuota(quota, period string) (float64, error) {
	q, err := strconv.ParseInt(strings.TrimSpace(quota), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("CPU quota %q: want microseconds or -1: %v", strings.TrimSpace(quota), err)
	}
	if q < 0 {
		return 0, nil
	}
	p, err := strconv.ParseInt(strings.TrimSpace(period), 10, 64)
	if err != nil || p <= 0 {
		return 0, fmt.Errorf("CPU period %q: want positive microseconds", strings.TrimSpace(period))
	}
	return float64(q) / float64(p), nil
}
