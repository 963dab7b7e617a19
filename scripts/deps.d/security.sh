# NVMe in-band authentication (docs/SECURITY.md): Debian 12's guest kernel
# has no CONFIG_NVME_AUTH, so test/fabric rebuilds the kernel's own NVMe host
# modules with it (Debian's linux-source and headers, fetched with apt-get
# download into build/vm) for the Linux-host DH-HMAC-CHAP acceptance test.
# Compiling needs the kernel's compiler and make; the kbuild tools link
# against libelf.
APT_PACKAGES="gcc-12 make binutils xz-utils libelf1"

post_install() {
  local d s
  d=$(dirname "${BASH_SOURCE[0]}")
  for s in "$d/.." "$d/../.." "$(pwd)"; do
    if [ -f "$s/test/fabric/auth_test.go" ] && command -v go >/dev/null; then
      (cd "$s" && TIER0_BUILD_NVME_AUTH=1 go test ./test/fabric -run TestBuildNvmeAuthModules -count=1 >/dev/null) ||
        echo "deps security: building the auth-capable NVMe host modules failed; the Linux DH-HMAC-CHAP subtests will skip" >&2
      return 0
    fi
  done
}
