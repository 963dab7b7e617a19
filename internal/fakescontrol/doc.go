// Package fakescontrol installs a fake scontrol for tests: a small shell
// script in a temporary directory that keeps node states and drain reasons
// in files and answers `show node -o`, `update ... state=drain|down|resume`
// the way Slurm 22.05's scontrol does, including its error messages and exit
// status. Tests can make the next calls fail as if slurmctld were away, or
// make every call hang.
package fakescontrol
