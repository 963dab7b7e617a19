// Package localcluster runs a site's tier0d processes on this machine, one
// per node, as children of the calling process: the one harness behind
// `tier0 validate --local` (validate), the fault campaigns and the nemesis
// (reliability/campaign) and the tests that stand up a real cluster.
//
// Procs starts, kills, freezes (SIGSTOP), thaws and stops the processes,
// each node's output appended to its log file, and only ever signals the
// processes it started (a PID file lets a later run stop the ones a killed
// run left behind: StopStale). The site helpers check that the site's
// ports are free (CheckPorts), shift them to run beside another cluster
// (ShiftPorts, FreePortShift) and remove exactly the work files a run
// creates (WorkPaths, CleanWork).
package localcluster
