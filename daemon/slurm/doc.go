// Package slurm is a small client for Slurm's scontrol: it reads a node's
// state and drain reason and drains or resumes nodes. Every call runs
// scontrol with a timeout and bounded retries, because scontrol blocks for
// about 9 s and then fails when slurmctld is unreachable. It is meant for
// control paths only (hooks, health checks), never for a data path.
//
// Tier0 marks its own drains with a reason that starts with ReasonPrefix;
// IsTier0Reason tells such a drain from an administrator's.
package slurm
