// Package units is tier0's one parser and one formatter of byte sizes, so
// that a size means the same in the site file, on the command line and in
// a report. Units are binary: K, KB, KiB are 1024 (as gdsio, fio and
// nvme-cli take them); case does not matter; "4096" is a byte count.
package units
