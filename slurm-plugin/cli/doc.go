// Package cli is the `tier0 slurm` verb group: the entry points Slurm runs
// (prolog, epilog, healthcheck) through the wrapper scripts in
// slurm-plugin/scripts. cmd/tier0 mounts Command on its root.
package cli
