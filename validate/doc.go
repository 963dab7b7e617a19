// Package validate is `tier0 validate`: it proves the whole story of the
// design end to end on a site — cluster up, raw drives, block layer and
// frontend measured, a node killed under verified load (its array moves
// complete, the others run degraded, no acknowledged block is lost), the
// node restarted, resync, failback, redundancy back, a final verify of
// every array, Slurm and GPUDirect Storage — and writes the results JSON
// and the report (packages bench and reports).
//
// With Options.Local it first starts the whole cluster on this machine,
// one tier0d child process per node, and tears it down afterwards (also
// when interrupted). Without it, it drives an existing cluster through its
// management API and frontends; the failover story then runs only with
// Options.AllowDisruptive, and a run without it ends ErrNotValidated unless
// Options.SkipFailover says so on purpose.
package validate
