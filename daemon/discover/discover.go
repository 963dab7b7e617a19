package discover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ErrNotFound: no drive matches a reference. ErrAmbiguous: several do.
var (
	ErrNotFound  = errors.New("drive not found")
	ErrAmbiguous = errors.New("drive reference is ambiguous")
)

// Options choose where to look.
type Options struct {
	// SysRoot is the sysfs mount ("/sys" when empty).
	SysRoot string
	// DevRoot is the device directory ("/dev" when empty); by-id links
	// are read from DevRoot/disk/by-id. Paths returned and accepted are
	// the real ones ("/dev/..."), mapped to and from DevRoot.
	DevRoot string
	// All includes namespaces imported over fabrics.
	All bool
}

func (o Options) sys() string {
	if o.SysRoot == "" {
		return "/sys"
	}
	return o.SysRoot
}

func (o Options) dev() string {
	if o.DevRoot == "" {
		return "/dev"
	}
	return o.DevRoot
}

// Drive is one NVMe namespace.
type Drive struct {
	Name       string   `json:"name"`       // nvme0n1
	Path       string   `json:"path"`       // /dev/nvme0n1
	ByID       string   `json:"by_id"`      // preferred /dev/disk/by-id link ("" if none)
	Links      []string `json:"links"`      // every /dev/disk/by-id link to it, sorted
	Controller string   `json:"controller"` // nvme0 (or the subsystem for multipath)
	Model      string   `json:"model"`      // trimmed
	Serial     string   `json:"serial"`     // trimmed
	Firmware   string   `json:"firmware"`   // trimmed
	Transport  string   `json:"transport"`  // pcie, tcp, rdma, fc, loop
	NSID       int      `json:"nsid"`       //
	WWID       string   `json:"wwid"`       // eui./nguid./uuid. identifier
	Size       int64    `json:"size"`       // bytes
	BlockSize  int      `json:"block_size"` // logical block size
}

// namespaceRE matches namespace block devices, not the hidden per-path
// devices of native multipath (nvme0c0n1).
var namespaceRE = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)

// Scan lists the node's NVMe namespaces, sorted by name.
func Scan(o Options) ([]Drive, error) {
	blockDir := filepath.Join(o.sys(), "block")
	ents, err := os.ReadDir(blockDir)
	if err != nil {
		return nil, fmt.Errorf("list %s (is sysfs mounted?): %w", blockDir, err)
	}
	links := byIDLinks(o)
	var out []Drive
	for _, e := range ents {
		if !namespaceRE.MatchString(e.Name()) {
			continue
		}
		d, err := readNamespace(o, e.Name())
		if err != nil {
			return nil, err
		}
		if !o.All && d.Transport != "pcie" {
			continue
		}
		d.Links = links[d.Name]
		d.ByID = preferredLink(d.Links)
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Drive) int { return naturalCompare(a.Name, b.Name) })
	return out, nil
}

func readAttr(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readNamespace(o Options, name string) (Drive, error) {
	dir := filepath.Join(o.sys(), "block", name)
	d := Drive{Name: name, Path: "/dev/" + name}
	sectors, err := strconv.ParseInt(readAttr(dir, "size"), 10, 64)
	if err != nil {
		return d, fmt.Errorf("%s: size: %w", dir, err)
	}
	d.Size = sectors * 512 // sysfs counts 512-byte sectors whatever the LBA size
	d.BlockSize, _ = strconv.Atoi(readAttr(filepath.Join(dir, "queue"), "logical_block_size"))
	if d.BlockSize == 0 {
		d.BlockSize = 512
	}
	d.NSID, _ = strconv.Atoi(readAttr(dir, "nsid"))
	d.WWID = readAttr(dir, "wwid")
	// device is the controller (nvme0) or, with native multipath, the
	// subsystem (nvme-subsys0), which has the same identity attributes.
	ctrl := filepath.Join(dir, "device")
	if target, err := filepath.EvalSymlinks(ctrl); err == nil {
		d.Controller = filepath.Base(target)
		ctrl = target
	}
	d.Model = readAttr(ctrl, "model")
	d.Serial = readAttr(ctrl, "serial")
	d.Firmware = readAttr(ctrl, "firmware_rev")
	d.Transport = readAttr(ctrl, "transport")
	if d.Transport == "" {
		// A subsystem: take the transport of its first controller.
		if ents, err := os.ReadDir(ctrl); err == nil {
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), "nvme") && !strings.HasPrefix(e.Name(), "nvme-") {
					if t := readAttr(filepath.Join(ctrl, e.Name()), "transport"); t != "" {
						d.Transport = t
						break
					}
				}
			}
		}
	}
	return d, nil
}

// byIDLinks maps namespace names to the by-id links that point at them.
func byIDLinks(o Options) map[string][]string {
	dir := filepath.Join(o.dev(), "disk", "by-id")
	ents, err := os.ReadDir(dir)
	out := map[string][]string{}
	if err != nil {
		return out
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "nvme-") {
			continue
		}
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		base := filepath.Base(target)
		out[base] = append(out[base], "/dev/disk/by-id/"+e.Name())
	}
	for k := range out {
		slices.Sort(out[k])
	}
	return out
}

// preferredLink picks the link a human would write: nvme-MODEL_SERIAL
// before its nvme-MODEL_SERIAL_NSID variant, before nvme-eui./nvme-uuid.
// forms; ties go to the first in sorted order.
func preferredLink(links []string) string {
	rank := func(l string) int {
		n := filepath.Base(l)
		switch {
		case strings.HasPrefix(n, "nvme-eui.") || strings.HasPrefix(n, "nvme-uuid.") || strings.HasPrefix(n, "nvme-nvme."):
			return 2
		case nsidSuffixRE.MatchString(n):
			return 1
		}
		return 0
	}
	best := ""
	for _, l := range links {
		if best == "" || rank(l) < rank(best) {
			best = l
		}
	}
	return best
}

var nsidSuffixRE = regexp.MustCompile(`_[0-9]{1,4}$`)

// naturalCompare orders nvme2n1 before nvme10n1.
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		da, db := digitsPrefix(a), digitsPrefix(b)
		if da > 0 && db > 0 {
			x, _ := strconv.Atoi(a[:da])
			y, _ := strconv.Atoi(b[:db])
			if x != y {
				return x - y
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return int(a[0]) - int(b[0])
		}
		a, b = a[1:], b[1:]
	}
	return len(a) - len(b)
}

func digitsPrefix(s string) int {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// Resolved is the result of resolving one drive reference.
type Resolved struct {
	// Path is the device node or regular file to open.
	Path string
	// Drive is the NVMe namespace, or nil for a regular file or a block
	// device that is not an NVMe namespace.
	Drive *Drive
}

// Resolve turns a drive reference from a site configuration into a path.
// Exactly one of path, byID and serial should be set:
//   - path: a device node (/dev/nvme0n1), a by-id link, or a regular
//     file (file-backed drives; it need not exist yet);
//   - byID: a /dev/disk/by-id name with or without the directory;
//   - serial: the controller serial number (the namespace must be the
//     only one on that controller).
//
// drives is the result of Scan (nil scans again).
func Resolve(o Options, drives []Drive, path, byID, serial string) (Resolved, error) {
	if drives == nil {
		var err error
		if drives, err = Scan(o); err != nil {
			return Resolved{}, err
		}
	}
	switch {
	case byID != "":
		if !strings.HasPrefix(byID, "/") {
			byID = "/dev/disk/by-id/" + byID
		}
		r, err := resolvePath(o, drives, byID)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrNotFound) {
			return r, fmt.Errorf("by-id %s: no such link; `tier0 config drives` lists the by-id names of this node's drives: %w", byID, ErrNotFound)
		}
		return r, err
	case serial != "":
		var hits []*Drive
		for i := range drives {
			if drives[i].Serial == strings.TrimSpace(serial) {
				hits = append(hits, &drives[i])
			}
		}
		switch len(hits) {
		case 0:
			return Resolved{}, fmt.Errorf("serial %q: no NVMe drive on this node has it; `tier0 config drives` lists serials: %w", serial, ErrNotFound)
		case 1:
			return Resolved{Path: hits[0].Path, Drive: hits[0]}, nil
		}
		var names []string
		for _, h := range hits {
			names = append(names, h.Name)
		}
		return Resolved{}, fmt.Errorf("serial %q matches %d namespaces (%s); give the path or by_id instead: %w", serial, len(hits), strings.Join(names, ", "), ErrAmbiguous)
	case path != "":
		return resolvePath(o, drives, path)
	}
	return Resolved{}, fmt.Errorf("empty drive reference: expected a path, a by_id name or a serial: %w", ErrNotFound)
}

// resolvePath follows a path (mapped into DevRoot when under /dev) to an
// NVMe namespace, or accepts it as a file or other block device.
func resolvePath(o Options, drives []Drive, path string) (Resolved, error) {
	local := path
	if rest, ok := strings.CutPrefix(path, "/dev/"); ok {
		local = filepath.Join(o.dev(), rest)
	}
	target := local
	if fi, err := os.Lstat(local); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		t, err := filepath.EvalSymlinks(local)
		if err != nil {
			return Resolved{}, fmt.Errorf("%s: dangling link: %w", path, os.ErrNotExist)
		}
		target = t
	} else if err != nil && strings.HasPrefix(path, "/dev/") {
		if errors.Is(err, os.ErrNotExist) {
			return Resolved{}, fmt.Errorf("%s: no such device or link on this node; `tier0 config drives` lists this node's NVMe drives: %w", path, ErrNotFound)
		}
		return Resolved{}, fmt.Errorf("%s: %w", path, err)
	}
	base := filepath.Base(target)
	for i := range drives {
		if drives[i].Name == base && (strings.HasPrefix(path, "/dev/") || target != local) {
			return Resolved{Path: drives[i].Path, Drive: &drives[i]}, nil
		}
	}
	if strings.HasPrefix(path, "/dev/") {
		return Resolved{Path: "/dev/" + strings.TrimPrefix(target, o.dev()+"/")}, nil
	}
	return Resolved{Path: path}, nil
}
