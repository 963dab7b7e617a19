// Package version holds the build's version, set at link time:
//
//	go build -ldflags "-X tier0/internal/version.Version=v0.3.0 \
//	  -X tier0/internal/version.Commit=$(git rev-parse --short HEAD) \
//	  -X tier0/internal/version.Date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" ./cmd/...
//
// Unset values fall back to what the Go tool recorded in the binary (the
// module version and VCS stamp, when built with VCS stamping).
package version
