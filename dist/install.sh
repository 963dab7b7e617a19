#!/bin/sh
# Install tier0 on this node: the tier0 and tier0d binaries, the systemd
# unit, /etc/default/tier0d, /etc/tier0 with an example site configuration
# and a fresh API token, and the operations guide. Existing settings, site
# configuration and token are never overwritten. Nothing is started.
#
#   make build && sudo dist/install.sh            # binaries from ./bin
#   sudo dist/install.sh /path/to/dir/with/binaries
#
# DESTDIR stages the files under another root (for packages); PREFIX is
# where the binaries and docs go (default /usr/local).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
src=${1:-$here/../bin}
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}

for b in tier0 tier0d; do
	if [ ! -x "$src/$b" ]; then
		echo "install.sh: $src/$b is missing or not executable; run 'make build' first or give the directory holding the binaries" >&2
		exit 1
	fi
done

install -d "$DESTDIR$PREFIX/bin" "$DESTDIR$PREFIX/share/doc/tier0" \
	"$DESTDIR/etc/systemd/system" "$DESTDIR/etc/default"
install -d -m 0755 "$DESTDIR/etc/tier0"
install -m 0755 "$src/tier0" "$src/tier0d" "$DESTDIR$PREFIX/bin/"

sed "s|/usr/local/|$PREFIX/|g" "$here/systemd/tier0d.service" >"$DESTDIR/etc/systemd/system/tier0d.service.new"
chmod 0644 "$DESTDIR/etc/systemd/system/tier0d.service.new"
mv "$DESTDIR/etc/systemd/system/tier0d.service.new" "$DESTDIR/etc/systemd/system/tier0d.service"

keep() { # keep FILE: say that an existing file stays as it is
	echo "install.sh: kept existing $1"
}
if [ -e "$DESTDIR/etc/default/tier0d" ]; then keep /etc/default/tier0d; else
	install -m 0644 "$here/default/tier0d" "$DESTDIR/etc/default/tier0d"
fi
install -m 0644 "$here/tier0.yaml" "$DESTDIR/etc/tier0/site.yaml.example"
if [ -e "$DESTDIR/etc/tier0/token" ]; then keep /etc/tier0/token; else
	# 32 random bytes as hex; readable by root only.
	(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$DESTDIR/etc/tier0/token")
fi
for d in OPERATIONS.md CONFIG.md CONTROL-PLANE.md SLURM.md; do
	if [ -f "$here/../docs/$d" ]; then
		install -m 0644 "$here/../docs/$d" "$DESTDIR$PREFIX/share/doc/tier0/$d"
	fi
done

cat <<MSG
tier0 installed under ${DESTDIR:-/}. Next, on every node:
  1. write /etc/tier0/site.yaml (start from /etc/tier0/site.yaml.example;
     the same file on every node) and check it: tier0 config validate /etc/tier0/site.yaml
  2. use ONE token on all nodes: copy /etc/tier0/token from the first node to the others
  3. set TIER0_NODE in /etc/default/tier0d if the host name is not the node name
  4. systemctl daemon-reload && systemctl enable --now tier0d
  5. tier0 status
See $PREFIX/share/doc/tier0/OPERATIONS.md.
MSG
