// Package archtest holds the test that keeps the package layering of
// docs/ARCHITECTURE.md true: it lists every package's imports with
// `go list` and fails when one imports a tier0 package its layer may not.
package archtest
