# Linux test guest (test/vm): QEMU, the initramfs tools, and nvme-cli/fio whose
# binaries and libraries are copied into the guest (xfsprogs: the file system
# through a failover, test/cluster). python3 extracts the
# uncompressed vmlinux; socat relays guestfwd connections.
APT_PACKAGES="qemu-system-x86 qemu-utils busybox-static kmod cpio zstd fio nvme-cli python3 socat xfsprogs"

# Download Debian's kernel package once (into build/vm/debs) so that the first
# guest test does not depend on the package mirror; the image itself is built
# on demand by package tier0/test/vm and cached under build/vm.
post_install() {
  # (install-deps.sh re-declares this function, so BASH_SOURCE may name
  # either scripts/install-deps.sh or this file)
  local d s
  d=$(dirname "${BASH_SOURCE[0]}")
  for s in "$d/../test/vm" "$d/../../test/vm" "$(pwd)/test/vm"; do
    if [ -x "$s/build-initramfs.sh" ]; then
      "$s/build-initramfs.sh" --fetch-kernel || echo "deps vm: kernel package download failed; guest tests will retry" >&2
      return 0
    fi
  done
  echo "deps vm: test/vm/build-initramfs.sh not found" >&2
}
