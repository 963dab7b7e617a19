// Package discover finds the NVMe drives inside a node from sysfs and
// resolves the drive references of a site configuration (a path, a
// /dev/disk/by-id name, or a serial number) to device nodes.
//
// It reads /sys/block/nvme*n* (namespaces: size, logical block size, NSID,
// WWID), each namespace's controller or subsystem (model, serial, firmware,
// transport; /sys/class/nvme/nvmeX), and the links in /dev/disk/by-id. The
// roots are injectable (Options) so that tests run on a fake tree.
//
// Only drives on the PCIe transport are local; namespaces imported over a
// fabric (tcp, rdma, fc, loop) — including tier0's own imports when the
// kernel initiator is used — are skipped unless Options.All is set.
package discover
