# Foundation: fio is the baseline for the local device bench; util-linux
# gives losetup for the loop-device tests.
APT_PACKAGES="fio util-linux"

# The loop-device tests need /dev/loop-control; load the module if the
# kernel has it as one (tests skip with the reason otherwise).
post_install() {
  [ -e /dev/loop-control ] || modprobe loop 2>/dev/null || true
}
