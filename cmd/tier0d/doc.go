// Command tier0d is the tier0 node daemon: it exports the node's drives on
// the backend fabric, runs the arrays the node owns, serves every array on
// the frontend fabric with ANA, and takes part in the control plane.
//
//	tier0d --site /etc/tier0/site.yaml --node A
package main
