package target

import (
	"encoding/binary"
	"os"
	"strings"
	"testing"

	"tier0/daemon/nvme"
)

// TestIdentifyReportsBootIncarnation: Identify Controller carries the
// node's boot incarnation, the hash of Config.BootID, behind its magic at
// nvme.IncarnationOff; another boot id gives another one, the same boot
// id (a restart of tier0d without a reboot) the same; without BootID it
// is the kernel's boot id's.
func TestIdentifyReportsBootIncarnation(t *testing.T) {
	read := func(cfg Config) ([]byte, uint64) {
		t.Helper()
		_, addr := newTarget(t, cfg, nil)
		a, _ := adminConnect(t, addr, 0, testHostNQN, testHostID)
		raw := a.identify(nvme.CNSController, 0).data
		ic, err := nvme.ParseIdentifyController(raw)
		if err != nil {
			t.Fatal(err)
		}
		return raw, ic.Incarnation
	}
	raw, inc := read(Config{BootID: "boot-1"})
	if want := incarnationOf("boot-1"); inc != want || inc == 0 {
		t.Fatalf("incarnation %#x with BootID boot-1, want %#x (non-zero)", inc, want)
	}
	off := nvme.IncarnationOff
	if string(raw[off:off+8]) != nvme.IncarnationMagic || binary.LittleEndian.Uint64(raw[off+8:]) != inc {
		t.Fatalf("vendor-specific bytes %d-%d: % x, want the magic %q then %#x", off, off+15, raw[off:off+16], nvme.IncarnationMagic, inc)
	}
	if _, again := read(Config{BootID: "boot-1"}); again != inc {
		t.Errorf("the same boot id after a restart: incarnation %#x, want %#x (unchanged)", again, inc)
	}
	if _, other := read(Config{BootID: "boot-2"}); other == inc || other == 0 {
		t.Errorf("another boot id: incarnation %#x, want one other than %#x", other, inc)
	}
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		t.Fatalf("the kernel's boot id: %v (tier0d runs on Linux, which has it)", err)
	}
	if _, def := read(Config{}); def != incarnationOf(strings.TrimSpace(string(b))) {
		t.Errorf("without BootID: incarnation %#x, want the hash of the kernel's boot id %q", def, strings.TrimSpace(string(b)))
	}
}
