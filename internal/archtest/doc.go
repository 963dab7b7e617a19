// Package archtest holds the test that keeps the package layering of
// docs/ARCHITECTURE.md true: it lists every package's imports with
// `go list` and fails when one imports a tier0 package its layer may not,
// or when the package table of docs/ARCHITECTURE.md is not exactly what
// the packages import, or when a package's comment is not in its doc.go.
package archtest
