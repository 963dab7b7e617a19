#!/usr/bin/env bash
# Installs what the test suite needs, idempotently. Run as root it installs
# Debian packages; otherwise it only reports what is missing (tests that need
# those packages skip and say why).
#
# Each layer keeps its own list in scripts/deps.d/NAME.sh. A file there sets
# APT_PACKAGES (space separated) and may define post_install() for extra
# steps (building a VM image...) and pre_install() for steps that must come
# before apt-get update (enabling an apt component). Both run only as root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

pkgs=()
pres=()
posts=()
for f in "$here"/deps.d/*.sh; do
  [ -e "$f" ] || continue
  APT_PACKAGES=""
  unset -f post_install pre_install 2>/dev/null || true
  # shellcheck disable=SC1090
  . "$f"
  for p in $APT_PACKAGES; do pkgs+=("$p"); done
  if declare -F post_install >/dev/null; then
    fn="post_$(basename "$f" .sh | tr -c 'a-zA-Z0-9_\n' _)"
    eval "$fn() { $(declare -f post_install | tail -n +2); }"
    posts+=("$fn")
  fi
  if declare -F pre_install >/dev/null; then
    fn="pre_$(basename "$f" .sh | tr -c 'a-zA-Z0-9_\n' _)"
    eval "$fn() { $(declare -f pre_install | tail -n +2); }"
    pres+=("$fn")
  fi
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if [ "$(id -u)" != 0 ]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: not root; missing packages (tests that need them will skip): ${missing[*]}" >&2
  fi
  exit 0
fi

for fn in "${pres[@]}"; do "$fn"; done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  # Keep package postinst scripts from starting daemons.
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ $created_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

for fn in "${posts[@]}"; do "$fn"; done
echo "install-deps: ok" >&2
