package fabric

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/target"
	"tier0/internal/testenv"
	"tier0/test/vm"
)

// In-band authentication (DH-HMAC-CHAP) between the Linux host and tier0's
// target. See docs/SECURITY.md.

const (
	authNQN     = "nqn.2026-11.io.tier0.test:auth"
	authOpenNQN = "nqn.2026-11.io.tier0.test:auth-per-host"
	// the guest's host identity (init takes harness.hostid)
	authGuestID  = "74696572-3000-4000-8000-0000000000a1"
	authGuestNQN = "nqn.2014-08.org.nvmexpress:uuid:" + authGuestID
)

// TestDHCHAPSecretNvmeCli checks secrets both ways with the host's nvme-cli:
// tier0 parses what `nvme gen-dhchap-key` makes, nvme-cli accepts what
// tier0 makes, and a transformed key from nvme-cli equals tier0's.
func TestDHCHAPSecretNvmeCli(t *testing.T) {
	if _, err := exec.LookPath("nvme"); err != nil {
		testenv.Missing(t, "nvme-cli not installed (scripts/deps.d/vm.sh installs it)")
	}
	for _, tc := range []struct {
		hmac uint8
		n    int
	}{{0, 32}, {1, 32}, {2, 48}, {3, 64}} {
		out, err := exec.Command("nvme", "gen-dhchap-key", fmt.Sprintf("--hmac=%d", tc.hmac), fmt.Sprintf("--key-length=%d", tc.n), "--nqn="+authGuestNQN).Output()
		if err != nil {
			t.Fatalf("nvme gen-dhchap-key: %v", err)
		}
		k, err := nvme.ParseDHCHAPSecret(strings.TrimSpace(string(out)))
		if err != nil || k.Hash != tc.hmac || len(k.Key) != tc.n {
			t.Fatalf("nvme-cli secret %q: %+v %v", out, k, err)
		}
		s, err := nvme.GenerateDHCHAPSecret(tc.n, tc.hmac)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("nvme", "check-dhchap-key", "--key="+s).CombinedOutput(); err != nil || !strings.Contains(string(out), "valid") {
			t.Fatalf("nvme check-dhchap-key %s: %v\n%s", s, err, out)
		}
	}
	// with --secret, nvme-cli prints the key transformed with the NQN
	raw := bytes.Repeat([]byte{0x5A}, 32)
	out, err := exec.Command("nvme", "gen-dhchap-key", fmt.Sprintf("--secret=%x", raw), "--hmac=1", "--nqn="+authGuestNQN).Output()
	if err != nil {
		t.Fatal(err)
	}
	k, err := nvme.ParseDHCHAPSecret(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	if want := (nvme.DHCHAPKey{Key: raw, Hash: nvme.HashSHA256}).Transform(authGuestNQN); !bytes.Equal(k.Key, want) {
		t.Fatalf("nvme-cli transformed key %x, tier0 %x", k.Key, want)
	}
}

// Debian 12's kernel is built without CONFIG_NVME_AUTH, so its NVMe host
// cannot authenticate. buildAuthModules rebuilds the kernel's own NVMe host
// modules (nvme-common, nvme-core, nvme-fabrics, nvme-tcp) from Debian's
// linux-source package with CONFIG_NVME_AUTH on, against the same kernel's
// headers and compiler, into build/vm/nvme-auth-modules/<kver>/ (about 160
// MB of downloads and a minute of compiling). When that directory exists
// (or TIER0_NVME_AUTH_MODULES names one), the guest loads these modules
// instead of its own and the DH-HMAC-CHAP interop subtests run. Build it
// with:
//
//	TIER0_BUILD_NVME_AUTH=1 go test ./test/fabric -run TestBuildNvmeAuthModules -v
//
// scripts/deps.d/security.sh runs it from make deps, so CI has them.
// The rebuilt host lacks the ffdhe groups (the kernel's builtin DH has no
// CONFIG_CRYPTO_DH_RFC7919_GROUPS), so the interop runs with the null group.
const buildAuthModules = `set -eu
KVER=$1 OUT=$2 W=$3
KPKG=linux-image-$KVER
mkdir -p "$W" "$OUT" && cd "$W"
SRCV=$(apt-cache show linux-headers-$KVER | awk '/^Version:/{print $2; exit}')
UPV=${KVER%%-*}; UPV=${UPV%.*}   # 6.1.0-57-amd64 -> 6.1
ls linux-source-${UPV}_*.deb >/dev/null 2>&1 || apt-get download -qq linux-source-$UPV linux-headers-$KVER linux-headers-${KVER%-*}-common linux-kbuild-$UPV
mkdir -p x && for d in *.deb; do dpkg -x "$d" x; done
[ -d linux-source-$UPV/drivers/nvme ] || tar -xJf x/usr/src/linux-source-$UPV.tar.xz --wildcards "linux-source-$UPV/drivers/nvme/*"
B=$PWD/x/usr/src/linux-headers-$KVER
echo "include $PWD/x/usr/src/linux-headers-${KVER%-*}-common/Makefile" > "$B/Makefile"
rm -rf src && mkdir src && cp -r linux-source-$UPV/drivers/nvme/common linux-source-$UPV/drivers/nvme/host src/
echo 'obj-m += common/ host/' > src/Makefile
make -C "$B" M="$PWD/src" CONFIG_NVME_AUTH=y CONFIG_NVME_COMMON=m CONFIG_NVME_CORE=m CONFIG_NVME_FABRICS=m CONFIG_NVME_TCP=m     CONFIG_BLK_DEV_NVME= CONFIG_NVME_RDMA= CONFIG_NVME_FC= CONFIG_NVME_APPLE=     KCFLAGS="-DCONFIG_NVME_AUTH=1 -DCONFIG_NVME_COMMON_MODULE=1" -j"$(nproc)" modules
for k in src/common/nvme-common.ko src/host/nvme-core.ko src/host/nvme-fabrics.ko src/host/nvme-tcp.ko; do
    strip --strip-debug -o "$OUT/$(basename $k)" "$k"
done
echo "built NVMe host modules with CONFIG_NVME_AUTH for $KVER (source $SRCV) in $OUT"
`

var authModuleNames = []string{"nvme-common.ko", "nvme-core.ko", "nvme-fabrics.ko", "nvme-tcp.ko"}

// authModulesDir returns where the auth-capable modules for kver are (or go).
func authModulesDir(t *testing.T, kver string) string {
	if d := os.Getenv("TIER0_NVME_AUTH_MODULES"); d != "" {
		return d
	}
	root, err := vm.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "build", "vm", "nvme-auth-modules", kver)
}

// TestBuildNvmeAuthModules builds the modules described at buildAuthModules
// (opt-in: TIER0_BUILD_NVME_AUTH=1, needs root and Debian's apt).
func TestBuildNvmeAuthModules(t *testing.T) {
	if os.Getenv("TIER0_BUILD_NVME_AUTH") != "1" {
		t.Skip("opt-in: set TIER0_BUILD_NVME_AUTH=1 to download Debian's kernel source and build auth-capable NVMe host modules")
	}
	img := vm.Image(t)
	out := authModulesDir(t, img.KVer)
	if files, _ := authModules(t, img.KVer); files != nil {
		t.Logf("already built in %s", out)
		return
	}
	root, err := vm.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(root, "build", "vm", "nvme-auth-build")
	cmd := exec.Command("bash", "-c", buildAuthModules, "build", img.KVer, out, work)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("building the modules: %v\n%s", err, b)
	}
	t.Logf("%s", b[max(0, len(b)-300):])
}

// authModules returns the guest files and the script lines that load the
// auth-capable modules, or nil when they are not built.
func authModules(t *testing.T, kver string) (map[string][]byte, string) {
	dir := authModulesDir(t, kver)
	files := map[string][]byte{}
	for _, n := range authModuleNames {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, ""
		}
		files["kmod/"+n] = b
	}
	// the stock modules' other dependencies (t10-pi, crc64 ...) first
	load := `for m in $(modprobe --show-depends nvme-tcp | awk '$1=="insmod"{print $2}'); do
    case $m in */nvme*) ;; *) insmod $m 2>/dev/null ;; esac
done
for m in nvme-common nvme-core nvme-fabrics nvme-tcp; do insmod /harness/kmod/$m.ko || exit 1; done
echo "loaded NVMe host modules with CONFIG_NVME_AUTH"
`
	return files, load
}

// guestHasAuth reports whether the guest kernel's NVMe host was built with
// CONFIG_NVME_AUTH (nvme_auth_negotiate is then a real, exported symbol).
func guestHasAuth(t *testing.T, g *vm.Guest) (bool, string) {
	out, rc, err := g.Exec("uname -r; grep -cw nvme_auth_negotiate /proc/kallsyms", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(out)
	kver := ""
	if len(lines) > 0 {
		kver = lines[0]
	}
	return rc == 0, kver
}

// TestFabricAuthGuest boots one Linux guest and connects its kernel host
// (nvme-cli) to tier0 targets that require DH-HMAC-CHAP: with the right
// secret (unidirectional and bidirectional) it does I/O, with a wrong
// secret or none it is refused; a host NQN not on the allow-list is
// refused; a host without a per-host secret connects as before.
func TestFabricAuthGuest(t *testing.T) {
	img := vm.Image(t)
	files, load := authModules(t, img.KVer)
	if load == "" {
		load = "modprobe nvme-tcp || exit 1\n"
	}
	g := vm.Start(t, vm.Options{Script: load + "echo ready > /harness/out/ready\n" + vm.ServeLoop, Files: files,
		Append: "harness.hostid=" + authGuestID, Timeout: 8 * time.Minute})
	if _, err := g.WaitFile("ready", 4*time.Minute); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			out, _, _ := g.Exec("dmesg | grep -i nvme | tail -40", time.Minute)
			t.Logf("guest dmesg:\n%s", out)
		}
		g.Stop()
		res := g.Wait()
		if t.Failed() {
			t.Logf("guest console:\n%s", res.Output)
		}
	}()

	hostSecret, err := nvme.GenerateDHCHAPSecret(32, nvme.HashSHA256)
	if err != nil {
		t.Fatal(err)
	}
	ctrlSecret, _ := nvme.GenerateDHCHAPSecret(32, nvme.HashNone)
	wrongSecret, _ := nvme.GenerateDHCHAPSecret(32, nvme.HashSHA256)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	go tg.Serve(l)
	defer tg.Close()
	port := l.Addr().(*net.TCPAddr).Port
	// DH groups: the guest kernel's crypto API must know the group the
	// target picks; null always works, ffdhe2048 needs
	// CONFIG_CRYPTO_DH_RFC7919_GROUPS, so the target prefers null here and
	// the ffdhe groups are covered by the tier0-host tests.
	add := func(nqn string, sc target.SubsystemConfig) {
		t.Helper()
		sc.NQN = nqn
		if err := tg.AddSubsystem(sc); err != nil {
			t.Fatal(err)
		}
		if err := tg.AddNamespace(nqn, target.NamespaceConfig{NSID: 1, Device: blockdev.NewMem(16<<20, 512)}); err != nil {
			t.Fatal(err)
		}
	}
	add(authNQN, target.SubsystemConfig{AllowedHosts: []string{authGuestNQN},
		DHCHAP: target.DHCHAPConfig{HostSecret: hostSecret, CtrlSecret: ctrlSecret, Hashes: []uint8{nvme.HashSHA256}, DHGroups: []uint8{nvme.DHGroupNull}}})
	add(authOpenNQN, target.SubsystemConfig{AllowAnyHost: true,
		DHCHAP: target.DHCHAPConfig{Hosts: map[string]target.DHCHAPSecrets{"nqn.2014-08.org.nvmexpress:uuid:someone-else": {HostSecret: hostSecret}}}})

	connect := func(nqn, extra string) string {
		return fmt.Sprintf("nvme connect -t tcp -a 10.0.2.2 -s %d -n %s %s", port, nqn, extra)
	}
	// ddVerify writes 1 MiB of random data through the block device and
	// reads it back
	const ddVerify = `wait_dev /dev/nvme0n1 && dd if=/dev/urandom of=/tmp/p bs=4k count=256 2>/dev/null &&
dd if=/tmp/p of=/dev/nvme0n1 bs=4k oflag=direct 2>/dev/null && dd if=/dev/nvme0n1 of=/tmp/q bs=4k count=256 iflag=direct 2>/dev/null &&
cmp /tmp/p /tmp/q && echo dd-verify-ok`
	run := func(cmd string) (string, int) {
		t.Helper()
		out, rc, err := g.Exec(fioVerify+cmd, 3*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return out, rc
	}
	refused := func(t *testing.T, what, cmd string) {
		t.Helper()
		out, rc := run(cmd + "; rc=$?; ls /dev/nvme* 2>/dev/null; nvme disconnect-all >/dev/null 2>&1; dmesg | grep -i nvme | tail -3; exit $rc")
		if rc == 0 || strings.Contains(out, "/dev/nvme0n1") {
			t.Fatalf("%s: the Linux host connected (rc %d):\n%s", what, rc, out)
		}
		t.Logf("%s refused as expected (rc %d): %s", what, rc, strings.TrimSpace(out))
	}

	t.Run("allow-list", func(t *testing.T) {
		refused(t, "host NQN not on the allow-list",
			connect(authNQN, "--hostnqn=nqn.2014-08.org.nvmexpress:uuid:74696572-3000-4000-8000-0000000000ff --dhchap-secret="+hostSecret))
	})
	t.Run("per-host-secret", func(t *testing.T) {
		// a host without an entry on a per-host subsystem connects as before
		out, rc := run(connect(authOpenNQN, "") + " && " + ddVerify + "; rc=$?; nvme disconnect -n " + authOpenNQN + "; exit $rc")
		if rc != 0 || !strings.Contains(out, "dd-verify-ok") {
			t.Fatalf("connect + dd verify without authentication: rc %d\n%s", rc, out)
		}
	})
	t.Run("no-secret", func(t *testing.T) {
		refused(t, "host without a secret", connect(authNQN, ""))
	})

	has, kver := guestHasAuth(t, g)
	t.Run("dhchap", func(t *testing.T) {
		if !has {
			t.Skipf("guest kernel %s was built without CONFIG_NVME_AUTH (Debian 12's 6.1 kernel): its NVMe host cannot do DH-HMAC-CHAP, "+
				"so only refusal of the unauthenticated host is checked here; build auth-capable modules with "+
				"TIER0_BUILD_NVME_AUTH=1 go test ./test/fabric -run TestBuildNvmeAuthModules (see buildAuthModules)", kver)
		}
		t.Run("right-secret", func(t *testing.T) {
			out, rc := run("dmesg -c >/dev/null; " + connect(authNQN, "--dhchap-secret="+hostSecret) + " && " + ddVerify +
				"; rc=$?; nvme disconnect -n " + authNQN + "; dmesg | grep -i auth; exit $rc")
			if rc != 0 || !strings.Contains(out, "dd-verify-ok") || !strings.Contains(out, "qid 0: authenticated") {
				t.Fatalf("connect with the secret + dd verify: rc %d\n%s", rc, out)
			}
			t.Logf("%s", out)
		})
		t.Run("bidirectional", func(t *testing.T) {
			out, rc := run("dmesg -c >/dev/null; " + connect(authNQN, "--dhchap-secret="+hostSecret+" --dhchap-ctrl-secret="+ctrlSecret) + " && " + ddVerify +
				"; rc=$?; nvme disconnect -n " + authNQN + "; dmesg | grep -i auth; exit $rc")
			if rc != 0 || !strings.Contains(out, "dd-verify-ok") || !strings.Contains(out, "controller authenticated") {
				t.Fatalf("bidirectional connect + dd verify: rc %d\n%s", rc, out)
			}
			t.Logf("%s", out)
		})
		t.Run("wrong-secret", func(t *testing.T) {
			refused(t, "wrong host secret", connect(authNQN, "--dhchap-secret="+wrongSecret))
		})
		t.Run("wrong-ctrl-secret", func(t *testing.T) {
			refused(t, "wrong controller secret", connect(authNQN, "--dhchap-secret="+hostSecret+" --dhchap-ctrl-secret="+wrongSecret))
		})
	})
}
