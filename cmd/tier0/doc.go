// Command tier0 is the tier0 CLI: configuration, cluster management, the
// standalone fabric tools, validation, benches, reports, Slurm hooks and the
// GPUDirect Storage validator.
//
// The command tree is built by newRootCmd (root.go), as etcd-io/bbolt's
// cmd/bbolt builds its own: one verb (or verb group) per file, each with a
// constructor newXxxCmd and an options struct that holds its flags
// (AddFlags) and is read by its run function. Nothing is registered in
// init and there are no global flag variables, so a test builds a fresh
// tree for every run. The root's --json is rootOptions.json, handed to the
// constructors of the verbs that print. The management verbs (status,
// array, node, drive, events) share clusterOptions (cluster.go): how to
// reach the cluster, through daemon/api's multi-endpoint client, and show,
// their common prologue: connect, fetch one view, print it as a table or,
// with --json, as JSON.
package main
