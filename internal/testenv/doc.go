// Package testenv decides what a test does when something it needs is
// missing here: root, a QEMU guest image, loop devices, network
// namespaces, Slurm's daemons, Debian's libcufile.
//
// On a developer's machine such a test skips and says what is missing. In
// CI (CI=true, as .ci/run runs) the machine is provisioned with all of it
// by `make test` (scripts/install-deps.sh), so the same absence is a
// failure: a guest image that failed to build must not turn a whole
// interoperability suite into silent skips.
package testenv
