// Package vm boots a Linux guest in QEMU for tests that need the real Linux
// NVMe/TCP host (native multipath, ANA) or the kernel's nvmet-tcp target,
// neither of which the build machine's own kernel offers.
//
// The guest is Debian 12's packaged kernel with busybox, kmod, nvme-cli and
// fio in an initramfs (test/vm/build-initramfs.sh). It boots under TCG in a
// few seconds, mounts the test's share directory at /harness over virtio-9p,
// runs /harness/run.sh, prints HARNESS-RC=<exit code> and powers off.
//
// Networking is QEMU user mode: the guest is 10.0.2.15, and the host's
// 127.0.0.1 is 10.0.2.2 from inside the guest, so a target served by the
// test process on 127.0.0.1:PORT is reached by the guest at 10.0.2.2:PORT.
// Guest ports listed in Options.HostFwd are exposed on host loopback at a
// free port, Guest.HostPort tells which; a guest service forwarded that way
// must listen on the guest NIC address 10.0.2.15 (or 0.0.0.0).
//
// Each boot costs about one core for several seconds (more on a loaded
// machine): keep guest tests few and combine checks into one script. Guests
// are serialized across test processes by a lock file so that parallel
// packages do not overload a small CI machine.
//
// Tests skip (with the reason) when not root, when qemu-system-x86_64 is
// missing or when the image cannot be built; set TIER0_VM_REQUIRED=1 to turn
// those skips into failures (CI that installed scripts/deps.d/vm.sh).
package vm
