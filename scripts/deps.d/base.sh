# Foundation: fio is the baseline for the local device bench; util-linux
# gives losetup for the loop-device tests.
APT_PACKAGES="fio util-linux"
