package diskstat

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// SectorSize is the unit of the sector fields of /sys/block/*/stat, whatever
// the device's logical block size.
const SectorSize = 512

// Counters are the fields of /sys/block/<dev>/stat that tier0 reports.
type Counters struct {
	ReadIOs      uint64 `json:"read_ios"`
	ReadSectors  uint64 `json:"read_sectors"`
	WriteIOs     uint64 `json:"write_ios"`
	WriteSectors uint64 `json:"write_sectors"`
}

// Device is one namespace in a snapshot.
type Device struct {
	NQN      string   `json:"nqn"`
	Counters Counters `json:"counters"`
}

// Snapshot is the counters of every matching device at one time.
type Snapshot struct {
	Time    time.Time         `json:"time"`
	Devices map[string]Device `json:"devices"`
}

// Usage is what happened between two snapshots.
type Usage struct {
	Seconds    float64 `json:"seconds"`
	ReadBytes  uint64  `json:"read_bytes"`
	WriteBytes uint64  `json:"write_bytes"`
	ReadIOs    uint64  `json:"read_ios"`
	WriteIOs   uint64  `json:"write_ios"`
	// Devices names the devices counted.
	Devices []string `json:"devices"`
}

var nsName = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)

// Take reads every NVMe namespace under sysBlock (normally /sys/block)
// whose subsystem NQN starts with nqnPrefix (every namespace when the prefix
// is empty). Per-path devices (nvmeXcYnZ) are skipped: the multipath head
// counts their I/O. A device that vanishes while being read is skipped.
func Take(sysBlock, nqnPrefix string, now time.Time) (Snapshot, error) {
	s := Snapshot{Time: now, Devices: map[string]Device{}}
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return s, fmt.Errorf("reading block devices in %s: %w", sysBlock, err)
	}
	for _, e := range ents {
		name := e.Name()
		if !nsName.MatchString(name) {
			continue
		}
		nqn := readTrim(filepath.Join(sysBlock, name, "device", "subsysnqn"))
		if nqnPrefix != "" && !strings.HasPrefix(nqn, nqnPrefix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, name, "stat"))
		if err != nil {
			continue
		}
		c, err := ParseStat(string(b))
		if err != nil {
			return s, fmt.Errorf("%s: %w", filepath.Join(sysBlock, name, "stat"), err)
		}
		s.Devices[name] = Device{NQN: nqn, Counters: c}
	}
	return s, nil
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

// ParseStat parses the fields of a /sys/block/<dev>/stat line (at least the
// first seven of the kernel's 11, 15 or 17).
func ParseStat(s string) (Counters, error) {
	f := strings.Fields(s)
	if len(f) < 7 {
		return Counters{}, fmt.Errorf("stat has %d fields, want at least 7 (kernel block stat format)", len(f))
	}
	var v [7]uint64
	for i := range v {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return Counters{}, fmt.Errorf("stat field %d %q is not a counter", i+1, f[i])
		}
		v[i] = n
	}
	return Counters{ReadIOs: v[0], ReadSectors: v[2], WriteIOs: v[4], WriteSectors: v[6]}, nil
}

// Delta returns the usage between start and end. Devices present in both
// with the same NQN and counters that did not go backwards are counted;
// others are named in the warnings (a namespace that appeared, vanished or
// was reset during the job).
func Delta(start, end Snapshot) (Usage, []string) {
	var u Usage
	var warn []string
	if d := end.Time.Sub(start.Time); d > 0 {
		u.Seconds = d.Seconds()
	}
	names := make([]string, 0, len(end.Devices))
	for n := range end.Devices {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := end.Devices[n]
		s, ok := start.Devices[n]
		switch {
		case !ok:
			warn = append(warn, n+" appeared during the job; not counted")
			continue
		case s.NQN != e.NQN:
			warn = append(warn, fmt.Sprintf("%s changed subsystem (%s -> %s); not counted", n, s.NQN, e.NQN))
			continue
		}
		a, b := s.Counters, e.Counters
		if b.ReadIOs < a.ReadIOs || b.ReadSectors < a.ReadSectors || b.WriteIOs < a.WriteIOs || b.WriteSectors < a.WriteSectors {
			warn = append(warn, n+" counters went backwards (device reset); not counted")
			continue
		}
		u.ReadIOs += b.ReadIOs - a.ReadIOs
		u.WriteIOs += b.WriteIOs - a.WriteIOs
		u.ReadBytes += (b.ReadSectors - a.ReadSectors) * SectorSize
		u.WriteBytes += (b.WriteSectors - a.WriteSectors) * SectorSize
		u.Devices = append(u.Devices, n)
	}
	for n := range start.Devices {
		if _, ok := end.Devices[n]; !ok {
			warn = append(warn, n+" vanished during the job; not counted")
		}
	}
	sort.Strings(warn)
	return u, warn
}
