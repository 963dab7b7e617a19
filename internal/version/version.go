package version

import (
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X tier0/internal/version.NAME=value".
var (
	Version = "dev"
	Commit  = ""
	Date    = ""
)

// Info is the version of the running binary.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Date    string `json:"date,omitempty"`
	Go      string `json:"go"`
}

// Get returns the version, filling unset fields from the build info.
func Get() Info {
	in := Info{Version: Version, Commit: Commit, Date: Date, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if in.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && in.Commit == "":
				in.Commit = s.Value
				if len(in.Commit) > 12 {
					in.Commit = in.Commit[:12]
				}
			case s.Key == "vcs.time" && in.Date == "":
				in.Date = s.Value
			}
		}
	}
	return in
}

// String returns a one-line description such as
// "tier0 v0.3.0 (commit 1a2b3c4d, built 2026-11-29T18:00:00Z, go1.26.0)".
func String() string {
	in := Get()
	s := "tier0 " + in.Version + " ("
	if in.Commit != "" {
		s += "commit " + in.Commit + ", "
	}
	if in.Date != "" {
		s += "built " + in.Date + ", "
	}
	return s + in.Go + ")"
}
