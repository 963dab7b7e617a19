// Package program implements the programs Slurm runs on a compute node for
// tier0: the Prolog (is this node's storage usable for the job?), the
// Epilog (what storage did the job use here?) and the HealthCheckProgram
// (drain the node when its storage role fails, resume it when healthy).
// The `tier0 slurm ...` verbs are thin wrappers around Runner.
package program
