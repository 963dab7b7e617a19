// Package health reads a tier0 node's health from its daemon
// (GET <api>/v1/node/health) and judges it for Slurm: is the node's storage
// role failed (drain it), is it healthy enough to take jobs again (resume
// it), and can a job reach the arrays it needs from here (Prolog).
package health
