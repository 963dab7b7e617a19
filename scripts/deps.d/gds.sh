# GDS validator (gds/): Debian's cuFile 1.4 from the non-free component.
# libcufile0 is the real library the "no GPU" verdict tests load;
# libcufile-dev carries cufile.h (reference only: the bindings load the
# library with dlopen and need no header). gcc and libc6-dev build the cgo
# bindings and the test-only stand-in cuFile/CUDA libraries.
#
# gds-tools (gdsio, gds_stats) is deliberately left out: it depends on
# libcuda1, i.e. the NVIDIA driver user space from contrib/non-free
# (nvidia-support, nvidia-alternative, nvidia-legacy-check), which would put
# a libcuda.so.1 on a GPU-less CI machine for no gain. The gdsio driver and
# the gds_stats path are tested with stand-in scripts instead.
APT_PACKAGES="libcufile0 libcufile-dev gcc libc6-dev"

# Runs as root before apt-get update: enable the non-free component,
# idempotently.
pre_install() {
  local f=/etc/apt/sources.list.d/debian.sources
  if [ -f "$f" ]; then
    sed -i -E '/^Components:/{/(^|[[:space:]])non-free([[:space:]]|$)/!s/$/ non-free/}' "$f"
  elif [ -f /etc/apt/sources.list ]; then
    sed -i -E '/^deb[[:space:]].*debian/{/(^|[[:space:]])non-free([[:space:]]|$)/!s/$/ non-free/}' /etc/apt/sources.list
  else
    echo "deps.d/gds.sh: no apt sources found; enable Debian non-free for libcufile0" >&2
  fi
}
