package host

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/target"
)

const authSubNQN = "nqn.2026-11.io.tier0.test:auth"
const authHostNQN = "nqn.2014-08.org.nvmexpress:uuid:auth-host"

func genSecret(t *testing.T, n int, h uint8) string {
	t.Helper()
	s, err := nvme.GenerateDHCHAPSecret(n, h)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// authTarget serves authSubNQN from a real tier0 target with dc.
func authTarget(t *testing.T, dc target.DHCHAPConfig) string {
	t.Helper()
	tg, err := target.New(target.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	if err := tg.AddSubsystem(target.SubsystemConfig{NQN: authSubNQN, AllowedHosts: []string{authHostNQN}, DHCHAP: dc}); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddNamespace(authSubNQN, target.NamespaceConfig{NSID: 1, Device: blockdev.NewMem(1<<20, 512)}); err != nil {
		t.Fatal(err)
	}
	return tg.Addr().String()
}

func authOpts(secret, ctrlSecret string) Options {
	return Options{SubNQN: authSubNQN, HostNQN: authHostNQN, IOQueues: 2, QueueDepth: 8, KATO: 2 * time.Second,
		CtrlLossTimeout: -1, DHCHAPSecret: secret, DHCHAPCtrlSecret: ctrlSecret}
}

func TestAuthTier0Target(t *testing.T) {
	hs := genSecret(t, 32, nvme.HashSHA256)
	cs := genSecret(t, 64, nvme.HashSHA512)
	for _, tc := range []struct {
		name   string
		groups []uint8
		ctrl   bool
	}{
		{"null unidirectional", []uint8{nvme.DHGroupNull}, false},
		{"null bidirectional", []uint8{nvme.DHGroupNull}, true},
		{"ffdhe2048 unidirectional", []uint8{nvme.DHGroup2048}, false},
		{"ffdhe2048 bidirectional", []uint8{nvme.DHGroup2048}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := authTarget(t, target.DHCHAPConfig{HostSecret: hs, CtrlSecret: cs, DHGroups: tc.groups})
			ctrl := ""
			if tc.ctrl {
				ctrl = cs
			}
			c, err := Dial(context.Background(), addr, authOpts(hs, ctrl))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ns, err := c.Namespace(1)
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, ns, 4096, 8192, 1)
		})
	}
}

func TestAuthWrongSecrets(t *testing.T) {
	hs := genSecret(t, 32, nvme.HashNone)
	cs := genSecret(t, 32, nvme.HashNone)
	addr := authTarget(t, target.DHCHAPConfig{HostSecret: hs, CtrlSecret: cs})
	for _, tc := range []struct {
		name, secret, ctrl, want string
	}{
		{"wrong host secret", genSecret(t, 32, nvme.HashNone), "", "check the secret"},
		{"wrong controller secret", hs, genSecret(t, 32, nvme.HashNone), "controller secret"},
		{"no secret", "", "", "configure the host secret"},
	} {
		_, err := Dial(context.Background(), addr, authOpts(tc.secret, tc.ctrl))
		if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrAuth mentioning %q", tc.name, err, tc.want)
		}
	}
	// the target without a controller secret cannot satisfy a host that asks
	addr = authTarget(t, target.DHCHAPConfig{HostSecret: hs})
	if _, err := Dial(context.Background(), addr, authOpts(hs, cs)); !errors.Is(err, ErrAuth) {
		t.Errorf("bidirectional against a target without controller secret: %v", err)
	}
	// a malformed secret is refused before dialling
	if _, err := Dial(context.Background(), addr, authOpts("DHHC-1:00:xyz:", "")); !errors.Is(err, nvme.ErrSecret) {
		t.Errorf("malformed secret: %v", err)
	}
}

// A host with a secret still connects to a target that does not ask for
// authentication (as Linux does).
func TestAuthNotRequired(t *testing.T) {
	addr := authTarget(t, target.DHCHAPConfig{})
	c, err := Dial(context.Background(), addr, authOpts(genSecret(t, 32, nvme.HashNone), ""))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// Reconnection authenticates the new association's queues again.
func TestAuthReconnect(t *testing.T) {
	hs := genSecret(t, 48, nvme.HashSHA384)
	tg, err := target.New(target.Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if err := tg.AddSubsystem(target.SubsystemConfig{NQN: authSubNQN, AllowedHosts: []string{authHostNQN}, DHCHAP: target.DHCHAPConfig{HostSecret: hs}}); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddNamespace(authSubNQN, target.NamespaceConfig{NSID: 1, Device: blockdev.NewMem(1<<20, 512)}); err != nil {
		t.Fatal(err)
	}
	o := authOpts(hs, "")
	o.CtrlLossTimeout = 10 * time.Second
	c, err := Dial(context.Background(), tg.Addr().String(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, ns, 0, 4096, 2)
	// DisallowHost drops the association; once allowed again the host
	// reconnects, and must authenticate every queue again before I/O works
	if err := tg.DisallowHost(authSubNQN, authHostNQN); err != nil {
		t.Fatal(err)
	}
	if err := tg.AllowHost(authSubNQN, authHostNQN); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Reconnects() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c.Reconnects() == 0 {
		t.Fatal("the host did not reconnect after being disconnected")
	}
	roundTrip(t, ns, 8192, 4096, 3)
}

// BenchmarkAuthDial measures a whole association (admin queue + 1 I/O
// queue, each authenticated) against the tier0 target, per DH group; the
// "off" case is the same Dial without authentication, the baseline.
func BenchmarkAuthDial(b *testing.B) {
	hs, _ := nvme.GenerateDHCHAPSecret(32, nvme.HashSHA256)
	for _, tc := range []struct {
		name  string
		group uint8
		off   bool
	}{{"off", 0, true}, {"null", nvme.DHGroupNull, false}, {"ffdhe2048", nvme.DHGroup2048, false}, {"ffdhe8192", nvme.DHGroup8192, false}} {
		b.Run(tc.name, func(b *testing.B) {
			dc := target.DHCHAPConfig{HostSecret: hs, DHGroups: []uint8{tc.group}}
			if tc.off {
				dc = target.DHCHAPConfig{}
			}
			tg, err := target.New(target.Config{Listen: "127.0.0.1:0"})
			if err != nil {
				b.Fatal(err)
			}
			if err := tg.Start(); err != nil {
				b.Fatal(err)
			}
			defer tg.Close()
			if err := tg.AddSubsystem(target.SubsystemConfig{NQN: authSubNQN, AllowAnyHost: true, DHCHAP: dc}); err != nil {
				b.Fatal(err)
			}
			o := authOpts(hs, "")
			o.IOQueues = 1
			for i := 0; i < b.N; i++ {
				c, err := Dial(context.Background(), tg.Addr().String(), o)
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}
