// Package config loads, validates and resolves a tier0 site configuration:
// a YAML file (read with viper) that describes the cluster's nodes and
// drives, its arrays, fabrics, control plane, policies, and the Slurm and
// GPUDirect Storage integrations. docs/CONFIG.md is the user reference.
//
// Load is the one entry point most callers need: it parses the file, fills
// in defaults, expands ${VAR} references in the work directory and drive
// paths, validates everything (collecting every problem, not just the
// first), and resolves automatic array placement (see Place), so that
// Array.Members always lists drive names afterwards.
package config
