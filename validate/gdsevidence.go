package validate

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"tier0/bench"
	"tier0/gds"
)

// loadedLibs lists the shared objects in a /proc/PID/maps text whose file
// name contains one of names ("libcufile", "libcuda."), with the version
// their file name carries (libcufile.so.1.9.1 -> 1.9.1), once each.
func loadedLibs(maps string, names ...string) []bench.LoadedLib {
	var out []bench.LoadedLib
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !strings.HasPrefix(f[5], "/") {
			continue
		}
		p := strings.Join(f[5:], " ")
		base := filepath.Base(p)
		for _, n := range names {
			if strings.HasPrefix(base, n) && !seen[p] {
				seen[p] = true
				v := ""
				if i := strings.Index(base, ".so."); i >= 0 {
					v = base[i+4:]
				}
				out = append(out, bench.LoadedLib{Name: n, Path: p, Version: v})
			}
		}
	}
	return out
}

// gdsLibraries is the evidence of what the GPUDirect check ran on: the
// cuFile and CUDA libraries mapped into this process (after gds.Validate
// loaded them), the nvidia-fs kernel module's version, and the overrides
// that point the validator at stand-ins. standIn is non-empty when the
// verdict cannot be a hardware proof, and says why.
func gdsLibraries() (libs []bench.LoadedLib, standIn string) {
	maps, _ := os.ReadFile("/proc/self/maps")
	libs = loadedLibs(string(maps), "libcufile", "libcuda.")
	nvfs := ""
	for _, p := range []string{"/sys/module/nvidia_fs/version", "/proc/driver/nvidia-fs/version"} {
		if b, err := os.ReadFile(p); err == nil {
			nvfs = strings.TrimSpace(string(b))
			libs = append(libs, bench.LoadedLib{Name: "nvidia-fs", Path: p, Version: firstLine(nvfs)})
			break
		}
	}
	var why []string
	for _, env := range []string{gds.EnvCufileLib, gds.EnvCUDALib, gds.EnvNvfsStats, gds.EnvNvfsParams} {
		if v := os.Getenv(env); v != "" {
			why = append(why, fmt.Sprintf("%s=%s", env, v))
		}
	}
	has := func(n string) bool {
		for _, l := range libs {
			if l.Name == n {
				return true
			}
		}
		return false
	}
	for _, n := range []string{"libcufile", "libcuda.", "nvidia-fs"} {
		if !has(n) {
			why = append(why, "no "+strings.TrimSuffix(n, ".")+" loaded")
		}
	}
	if len(why) > 0 {
		standIn = "not a hardware proof: " + strings.Join(why, ", ")
	}
	return libs, standIn
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// mountOf finds the mount holding dir in a /proc/self/mountinfo text: the
// longest mount point that is dir or one of its parents.
func mountOf(mountinfo, dir string) (point, source, fstype string, ok bool) {
	dir = filepath.Clean(dir)
	sc := bufio.NewScanner(strings.NewReader(mountinfo))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		mp := unescapeMount(f[4])
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(point) {
			point, fstype, source, ok = mp, f[sep+1], f[sep+2], true
		}
	}
	return point, source, fstype, ok
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// gdsMountProblem says why dir is not a file system on a tier0 volume
// (empty when it is one: a mount whose source is an NVMe namespace, as
// the kernel's NVMe/TCP multipath host presents a tier0 frontend).
func gdsMountProblem(mountinfo, dir, siteFile string) (bench.GDSMount, string) {
	if dir == "" {
		return bench.GDSMount{}, fmt.Sprintf("gds.mount is not set in %s: the GPUDirect check reads only from a file system on a tier0 volume (connect a frontend namespace with nvme connect, make a file system on it, mount it and set gds.mount to the mount point); it never reads from the work directory", siteFile)
	}
	point, src, fs, ok := mountOf(mountinfo, dir)
	m := bench.GDSMount{Dir: dir, MountPoint: point, Source: src, FSType: fs}
	switch {
	case !ok:
		return m, fmt.Sprintf("gds.mount %s: no mount found for it in /proc/self/mountinfo", dir)
	case !strings.HasPrefix(filepath.Base(src), "nvme"):
		return m, fmt.Sprintf("gds.mount %s is on %s (%s, mounted at %s), not on an NVMe namespace of a tier0 volume; mount the file system of a tier0 frontend namespace (/dev/nvmeXnY) there", dir, src, fs, point)
	}
	return m, ""
}
