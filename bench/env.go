package bench

import (
	"runtime"

	"github.com/klauspost/cpuid/v2"
	"github.com/shirou/gopsutil/v3/host"
	"github.com/shirou/gopsutil/v3/mem"

	"tier0/internal/version"
)

// Environment describes the machine a run was measured on.
type Environment struct {
	Host          string `json:"host"`
	OS            string `json:"os"`
	Platform      string `json:"platform,omitempty"`
	Kernel        string `json:"kernel,omitempty"`
	Arch          string `json:"arch"`
	CPU           string `json:"cpu"`
	CPUVendor     string `json:"cpu_vendor,omitempty"`
	PhysicalCores int    `json:"physical_cores"`
	LogicalCores  int    `json:"logical_cores"`
	MemoryBytes   uint64 `json:"memory_bytes"`
	// CPUs is what the run may use of the host's cores: its affinity mask
	// and cgroup quota (nil in results written before it was recorded).
	CPUs         *CPULimits `json:"cpus,omitempty"`
	GoVersion    string     `json:"go_version"`
	Tier0Version string     `json:"tier0_version"`
	Site         string     `json:"site,omitempty"`
	// Problems lists what could not be determined, and why.
	Problems []string `json:"problems,omitempty"`
}

// CollectEnvironment describes this machine. tier0Version overrides the
// version recorded (empty: this binary's, from internal/version); site is
// the site config's name.
// What cannot be read is listed in Problems rather than failing.
func CollectEnvironment(tier0Version, site string) Environment {
	e := Environment{
		OS: runtime.GOOS, Arch: runtime.GOARCH, GoVersion: runtime.Version(),
		Tier0Version: tier0Version, Site: site,
		CPU: cpuid.CPU.BrandName, CPUVendor: cpuid.CPU.VendorString,
		PhysicalCores: cpuid.CPU.PhysicalCores, LogicalCores: cpuid.CPU.LogicalCores,
	}
	if e.LogicalCores == 0 {
		e.LogicalCores = runtime.NumCPU()
	}
	if e.Tier0Version == "" {
		v := version.Get()
		e.Tier0Version = v.Version
		if v.Commit != "" {
			e.Tier0Version += "+" + v.Commit
		}
	}
	cl, err := ReadCPULimits()
	e.CPUs = &cl
	if err != nil {
		e.Problems = append(e.Problems, "cgroup CPU quota: "+err.Error())
	}
	if hi, err := host.Info(); err == nil {
		e.Host, e.Platform, e.Kernel = hi.Hostname, hi.Platform+" "+hi.PlatformVersion, hi.KernelVersion
	} else {
		e.Problems = append(e.Problems, "host info: "+err.Error())
	}
	if vm, err := mem.VirtualMemory(); err == nil {
		e.MemoryBytes = vm.Total
	} else {
		e.Problems = append(e.Problems, "memory: "+err.Error())
	}
	return e
}
