// Package diskstat snapshots the I/O counters of tier0's NVMe namespaces on
// a node (/sys/block/nvmeXnY/stat, selected by the subsystem NQN) and turns
// two snapshots into the bytes and I/Os done in between. The Slurm Prolog
// takes the first snapshot, the Epilog the second.
package diskstat
