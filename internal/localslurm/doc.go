// Package localslurm runs a throw-away Slurm cluster on this machine: its
// own munged (own key and socket), slurmctld and one slurmd per node
// (slurmd -N), on 127.0.0.1 only, everything under one folder. It is the
// one Slurm-on-one-machine helper: `tier0 validate --local-slurm` runs the
// real hook wrappers through it, and slurm-plugin/slurmtest runs its
// tests against it.
//
// It needs root and Debian's slurmctld, slurmd, slurm-client and munge
// packages (scripts/deps.d/slurm.sh); Missing says what is absent.
package localslurm
