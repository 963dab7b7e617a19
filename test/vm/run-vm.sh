#!/bin/bash
# run-vm.sh - boot tier0's test guest non-interactively, run a guest script, exit.
# (Go tests use package tier0/test/vm, which builds the image and calls this.)
#
# Usage: IMG=DIR run-vm.sh SHARE_DIR
#   SHARE_DIR is exported to the guest over
#   virtio-9p (tag "harness") and mounted at /harness; the guest runs
#   /harness/run.sh, tees its output to /harness/out/console.log and powers off.
#   Exit status of run-vm.sh = exit status of run.sh (parsed from the console),
#   124 on timeout, 125 if the marker line never appeared.
#
# Environment:
#   IMG=<dir>  (vmlinux, vmlinuz, initramfs.img from build-initramfs.sh;
#              default: the newest image under build/vm)
#   MEM=1024  SMP=2  TIMEOUT=300
#   ACCEL=auto|kvm|tcg
#   BOOT=pvh|bzimage          pvh (default when $IMG/vmlinux exists) boots the
#                             uncompressed ELF directly; ~3 s faster under TCG
#   HOSTFWD="4420"            space-separated guest TCP ports; each is exposed
#                             on host 127.0.0.1:<port> (or "hostport:guestport")
#   NET_RESTRICT=off|on       on = slirp restrict mode (guest can reach nothing
#                             outside, hostfwd/guestfwd still work)
#   GUESTFWD="10.0.2.100:80=127.0.0.1:18080 ..."  guest connections to the
#                             left address are relayed to the host address
#   EXTRA_APPEND=""           extra kernel command-line words
#   CONSOLE_LOG=<file>        also save the full serial console here
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
IMG=${IMG:-$(ls -td "$ROOT"/build/vm/img-*/ 2>/dev/null | head -1)}
SHARE=${1:?usage: IMG=DIR run-vm.sh SHARE_DIR}
[ -e "$IMG/initramfs.img" ] || { echo "run-vm: no image in '$IMG' (build one: test/vm/build-initramfs.sh DIR)" >&2; exit 2; }
MEM=${MEM:-1024}
SMP=${SMP:-2}
TIMEOUT=${TIMEOUT:-300}
ACCEL=${ACCEL:-auto}
HOSTFWD=${HOSTFWD:-}
NET_RESTRICT=${NET_RESTRICT:-off}
EXTRA_APPEND=${EXTRA_APPEND:-}
BOOT=${BOOT:-$([ -e "$IMG/vmlinux" ] && echo pvh || echo bzimage)}
if [ "$BOOT" = pvh ]; then KERNEL=$IMG/vmlinux; else KERNEL=$IMG/vmlinuz; fi
CONSOLE_LOG=${CONSOLE_LOG:-$SHARE/out/qemu-console.log}

kvm_ok() {
    # /dev/kvm must be backed by hardware virtualisation (kvm_intel/kvm_amd).
    # Some sandboxes (e.g. Firecracker with the out-of-tree kvm_pvm module)
    # expose a /dev/kvm that answers KVM_GET_API_VERSION but can only run
    # PVM-aware guest kernels: a stock Debian kernel crawls (~100x slower than
    # TCG) and dies with "KVM internal error. Suberror: 1 / emulation failure".
    [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
    [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ] || return 1
}
if [ "$ACCEL" = auto ]; then
    if kvm_ok; then ACCEL=kvm; else ACCEL=tcg; fi
fi
if [ "$ACCEL" = kvm ]; then
    # -arch-capabilities: nested KVM often refuses MSR 0x10a
    # ("failed to set MSR 0x10a to 0x69", qemu aborts)
    ACCEL_ARGS=(-accel kvm -cpu host,-arch-capabilities)
else
    ACCEL_ARGS=(-accel tcg,thread=multi,tb-size=256 -cpu max)
fi

NET="user,id=n0,restrict=$NET_RESTRICT"
for p in $HOSTFWD; do
    case $p in *:*) hp=${p%%:*}; gp=${p#*:};; *) hp=$p; gp=$p;; esac
    NET+=",hostfwd=tcp:127.0.0.1:$hp-10.0.2.15:$gp"
done

for g in ${GUESTFWD:-}; do
    # cmd: spawns one relay per guest connection (a plain tcp: chardev
    # target is connected once at startup and serves ONE connection only)
    NET+=",guestfwd=tcp:${g%%=*}-cmd:socat STDIO TCP:${g#*=}"
done

mkdir -p "$SHARE/out"
rm -f "$SHARE/out/console.log" "$CONSOLE_LOG"

APPEND="console=ttyS0 quiet loglevel=4 panic=-1 oops=panic nokaslr mitigations=off $EXTRA_APPEND"

START=$(date +%s.%N)
timeout --foreground -k 5 "$TIMEOUT" \
qemu-system-x86_64 \
    "${ACCEL_ARGS[@]}" -M q35 -smp "$SMP" -m "$MEM" \
    -no-user-config -nodefaults -display none -monitor none -serial stdio \
    -no-reboot \
    -kernel "$KERNEL" -initrd "$IMG/initramfs.img" -append "$APPEND" \
    -netdev "$NET" -device virtio-net-pci,netdev=n0 \
    -fsdev local,id=h0,path="$SHARE",security_model=none \
    -device virtio-9p-pci,fsdev=h0,mount_tag=harness \
    -device virtio-rng-pci \
    </dev/null 2>&1 | tee "$CONSOLE_LOG"
QRC=${PIPESTATUS[0]}
END=$(date +%s.%N)
echo "run-vm: accel=$ACCEL boot=$BOOT qemu_rc=$QRC wall=$(awk "BEGIN{printf \"%.2f\", $END-$START}")s" >&2

[ $QRC -eq 124 ] && { echo "run-vm: TIMEOUT after ${TIMEOUT}s" >&2; exit 124; }
RC=$(sed -n 's/.*HARNESS-RC=\([0-9]*\).*/\1/p' "$CONSOLE_LOG" | tail -1)
[ -n "$RC" ] || { echo "run-vm: no HARNESS-RC marker (guest crashed?)" >&2; exit 125; }
exit "$RC"
