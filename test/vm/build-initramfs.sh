#!/bin/bash
# build-initramfs.sh - build the kernel + initramfs of tier0's Linux test guest.
#
# Usage: build-initramfs.sh OUTDIR            build OUTDIR/{vmlinux,vmlinuz,initramfs.img,KVER}
#        build-initramfs.sh --fetch-kernel    only download the kernel package
#
# The guest boots Debian 12's packaged kernel with busybox, kmod, nvme-cli,
# fio and (when installed here) xfsprogs in an initramfs, so tests get the
# real Linux NVMe/TCP host (native multipath, ANA), the nvmet-tcp target and
# XFS. Host packages come from
# scripts/deps.d/vm.sh (make deps). The kernel .deb is cached in $KDEB_DIR
# (default: build/vm/debs under the repository root).
#
# Environment: WORK (scratch dir, default OUTDIR.work), KDEB_DIR, COMPRESS
# (none|zstd|gzip; none boots fastest under TCG).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
KDEB_DIR=${KDEB_DIR:-$ROOT/build/vm/debs}
COMPRESS=${COMPRESS:-none}

log() { echo "[vm-build $(date +%T)] $*" >&2; }

KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$KPKG" ]; then
    # apt lists missing (no apt-get update yet): fall back to a cached .deb
    KPKG=$(ls "$KDEB_DIR"/linux-image-[0-9]*_amd64.deb 2>/dev/null | sort -V | tail -1 | xargs -r basename | cut -d_ -f1)
fi
[ -n "$KPKG" ] || { echo "build-initramfs: cannot resolve linux-image-amd64 (run apt-get update, or make deps)" >&2; exit 1; }
KVER=${KPKG#linux-image-}

fetch_kernel() {
    ls "$KDEB_DIR"/"${KPKG}"_*.deb >/dev/null 2>&1 && return 0
    log "downloading $KPKG into $KDEB_DIR"
    mkdir -p "$KDEB_DIR"
    # apt-get download as root into a dir _apt cannot write to works
    # (prints a harmless "unsandboxed" warning).
    (cd "$KDEB_DIR" && apt-get download -qq "$KPKG")
}

if [ "${1:-}" = --fetch-kernel ]; then fetch_kernel; exit 0; fi
OUTDIR=${1:?usage: build-initramfs.sh OUTDIR}
WORK=${WORK:-$OUTDIR.work}
for tool in busybox kmod nvme fio cpio python3 depmod; do
    command -v "$tool" >/dev/null || [ -x /bin/$tool ] || [ -x /sbin/$tool ] || [ -x /usr/sbin/$tool ] || {
        echo "build-initramfs: $tool is missing (install scripts/deps.d/vm.sh packages: make deps)" >&2; exit 1; }
done
fetch_kernel
KSTAGE=$WORK/kstage
if [ ! -e "$KSTAGE/boot/vmlinuz-$KVER" ]; then
    rm -rf "$KSTAGE" && mkdir -p "$KSTAGE"
    dpkg -x "$KDEB_DIR"/"${KPKG}"_*.deb "$KSTAGE"
    depmod -b "$KSTAGE" "$KVER"          # package ships no modules.dep
fi
KMOD=$KSTAGE/lib/modules/$KVER

# ---------------------------------------------------------------- rootfs
R=$WORK/rootfs
log "assembling rootfs in $R (kernel $KVER)"
rm -rf "$R"
mkdir -p "$R"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,tmp,run,mnt,root,var/tmp}
# merged-/usr layout, same as a fresh Debian 12
ln -s usr/bin "$R/bin"; ln -s usr/sbin "$R/sbin"; ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"

# busybox (static) + applet symlinks
cp /bin/busybox "$R/usr/bin/busybox"
for a in $(/bin/busybox --list); do
    [ "$a" = busybox ] && continue
    ln -sf busybox "$R/usr/bin/$a"
done

# copy a binary and its whole shared-library closure (ldd) into $R
copy_bin() {   # $1 = host path, $2 = path inside rootfs (default: same)
    local src=$1 dst=${2:-$1}
    install -D -m 0755 "$src" "$R$dst"
    ldd "$src" | awk '/=>/ && $3 ~ /^\// {print $3} /^\t\/.*ld-linux/ {print $1}' |
    while read -r lib; do
        [ -e "$R$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$R$lib"
    done
}
copy_bin /usr/sbin/nvme
copy_bin /usr/bin/fio
copy_bin /usr/bin/kmod
# xfsprogs (test/cluster's file system through a failover): optional, so
# that the image still builds without it; the test reports it missing.
for b in mkfs.xfs xfs_repair; do
    p=$(command -v $b || true); [ -n "$p" ] || p=/usr/sbin/$b
    if [ -x "$p" ]; then copy_bin "$p" "/usr/sbin/$b"
    else log "no $b on this machine (apt-get install xfsprogs): the guest has no XFS tools"; fi
done
# rdma-core (test/rdma: NVMe over RDMA on soft-RoCE): libibverbs, librdmacm,
# the rxe provider and its driver file, iproute2's rdma tool (rdma link add).
# Optional, so that the image still builds without them; test/rdma reports
# them missing. Install scripts/deps.d/rdma.sh.
for b in /usr/bin/ibv_devinfo /usr/bin/rping /usr/bin/rdma; do
    if [ -x "$b" ]; then copy_bin "$b"
    else log "no $b on this machine (scripts/deps.d/rdma.sh): the guest has no rdma-core"; fi
done
RXE=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so 2>/dev/null | head -1 || true)
if [ -n "$RXE" ] && [ -e /etc/libibverbs.d/rxe.driver ]; then
    copy_bin "$RXE"
    install -D -m 0644 /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/rxe.driver"
fi
# kmod's modprobe (handles softdeps / aliases, e.g. crypto-crc32c requested
# by the kernel) overrides busybox's applets
for a in modprobe insmod rmmod lsmod modinfo depmod; do ln -sf kmod "$R/usr/bin/$a"; done
ln -sf ../bin/kmod "$R/usr/sbin/modprobe"   # /proc/sys/kernel/modprobe = /sbin/modprobe
ldconfig -r "$R" 2>/dev/null || true

# minimal /etc
echo 'root:x:0:0:root:/root:/bin/sh' > "$R/etc/passwd"
echo 'root:x:0:' > "$R/etc/group"
echo 'harness' > "$R/etc/hostname"
printf '127.0.0.1 localhost\n10.0.2.2 host\n' > "$R/etc/hosts"
mkdir -p "$R/etc/nvme"

# ---------------------------------------------------------------- modules
MODS="nvme-core nvme-fabrics nvme-tcp nvmet nvmet-tcp configfs
      brd loop null_blk
      virtio_pci virtio_net virtio_blk 9pnet_virtio 9p virtio-rng
      crc32c-intel crc32c_generic crc64_rocksoft_generic crct10dif-pclmul
      xfs
      rdma_rxe rdma_ucm ib_uverbs nvme-rdma nvmet-rdma crc32_generic"
mkdir -p "$R/lib/modules/$KVER"
for m in $MODS; do
    modprobe -d "$KSTAGE" -S "$KVER" --show-depends "$m" 2>/dev/null |
        awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
    rel=${ko#"$KMOD"/}
    install -D -m 0644 "$ko" "$R/lib/modules/$KVER/$rel"
done
cp "$KMOD"/modules.order "$KMOD"/modules.builtin "$KMOD"/modules.builtin.modinfo "$R/lib/modules/$KVER/"
depmod -b "$R" "$KVER"

# ---------------------------------------------------------------- /init
install -m 0755 "$HERE/init" "$R/init"

# ---------------------------------------------------------------- pack
mkdir -p "$OUTDIR"
cp "$KSTAGE/boot/vmlinuz-$KVER" "$OUTDIR/vmlinuz"
# Uncompressed ELF vmlinux for PVH direct boot (qemu -kernel vmlinux): skips
# SeaBIOS' real-mode loader and the in-guest xz decompressor, which under TCG
# cost ~3 s per boot.  Debian's bzImage payload is xz; handle gzip/zstd too.
python3 - "$OUTDIR/vmlinuz" "$OUTDIR/vmlinux" <<'PY'
import sys, lzma, gzip, subprocess
d = open(sys.argv[1], "rb").read()
for magic, kind in ((b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x1f\x8b\x08\x00", "gz")):
    i = d.find(magic)
    if i < 0:
        continue
    try:
        if kind == "xz":
            out = lzma.LZMADecompressor().decompress(d[i:])
        elif kind == "gz":
            out = gzip.GzipFile(fileobj=__import__("io").BytesIO(d[i:])).read()
        else:
            out = subprocess.run(["zstd", "-dc"], input=d[i:], capture_output=True).stdout
    except Exception:
        continue
    if out[:4] == b"\x7fELF":
        open(sys.argv[2], "wb").write(out)
        sys.exit(0)
sys.exit("could not extract vmlinux from bzImage")
PY
echo "$KVER" > "$OUTDIR/KVER"
log "packing cpio ($COMPRESS)"
( cd "$R" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet ) > "$OUTDIR/initramfs.cpio"
case $COMPRESS in
    zstd) zstd -q -f -T0 -"${ZSTD_LEVEL:-3}" --rm "$OUTDIR/initramfs.cpio" -o "$OUTDIR/initramfs.img" ;;
    gzip) gzip -"${GZIP_LEVEL:-6}" -c "$OUTDIR/initramfs.cpio" > "$OUTDIR/initramfs.img"; rm "$OUTDIR/initramfs.cpio" ;;
    none) mv "$OUTDIR/initramfs.cpio" "$OUTDIR/initramfs.img" ;;
esac
log "rootfs $(du -sh "$R" | cut -f1), initramfs $(du -h "$OUTDIR/initramfs.img" | cut -f1), kernel $(du -h "$OUTDIR/vmlinuz" | cut -f1)"
rm -rf "$R"
