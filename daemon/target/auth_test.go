package target

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"tier0/daemon/nvme"
)

func mustSecret(t testing.TB, n int, h uint8) string {
	t.Helper()
	s, err := nvme.GenerateDHCHAPSecret(n, h)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// authTarget is newTarget with DH-HMAC-CHAP on testSubNQN.
func authTarget(t *testing.T, dc DHCHAPConfig) string {
	t.Helper()
	tg, addr := newTarget(t, Config{}, nil)
	if err := tg.SetDHCHAP(testSubNQN, dc); err != nil {
		t.Fatal(err)
	}
	return addr
}

func (c *rawClient) authSend(msg []byte) nvme.CQE {
	return c.do(nvme.DHCHAPAuthCmd(true, len(msg)).SQE(0), msg, true).cqe
}

func (c *rawClient) authRecv() ([]byte, nvme.CQE) {
	s := nvme.DHCHAPAuthCmd(false, 4096).SQE(0)
	s.DPTR = nvme.SGL{Length: 4096, Type: nvme.SGLTypeTransport}
	r := c.do(s, nil, false)
	return r.data, r.cqe
}

// rawAuth runs the host side of DH-HMAC-CHAP by hand, offering one hash
// and one DH group. It returns the Failure1 the controller sent, if any.
func rawAuth(t *testing.T, c *rawClient, hostnqn, secret, ctrlSecret string, hash, group uint8) *nvme.AuthFailure {
	t.Helper()
	key, err := nvme.ParseDHCHAPSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	const tid = 77
	neg := nvme.AuthNegotiate{TID: tid, Protocols: []nvme.DHCHAPProtocol{{AuthID: 1, Hashes: []uint8{hash}, DHGroups: []uint8{group}}}}
	if cqe := c.authSend(neg.Append(nil)); !cqe.Status.OK() {
		t.Fatalf("negotiate: %v", cqe.Status)
	}
	b, cqe := c.authRecv()
	if !cqe.Status.OK() || len(b) != 4096 {
		t.Fatalf("receive challenge: %v, %d bytes", cqe.Status, len(b))
	}
	if f, err := nvme.ParseAuthFailure(b); err == nil {
		return &f
	}
	ch, err := nvme.ParseAuthChallenge(b)
	if err != nil || ch.TID != tid || ch.HashID != hash || ch.DHGroup != group {
		t.Fatalf("challenge %+v: %v", ch, err)
	}
	reply := nvme.AuthReply{TID: tid}
	chal := ch.C
	var sess []byte
	if group != nvme.DHGroupNull {
		dh, err := nvme.NewDH(group, nil)
		if err != nil {
			t.Fatal(err)
		}
		if sess, err = dh.Shared(ch.DHV); err != nil {
			t.Fatal(err)
		}
		reply.DHV = dh.Public
		chal = nvme.AugmentChallenge(hash, sess, ch.C)
	} else if len(ch.DHV) != 0 {
		t.Fatalf("null group challenge carries %d DH bytes", len(ch.DHV))
	}
	reply.R = nvme.DHCHAPResponse(hash, key.Transform(hostnqn), chal, ch.Seq, tid, nvme.RoleHost, hostnqn, testSubNQN)
	if ctrlSecret != "" {
		reply.CValid, reply.Seq, reply.C2 = true, 1234, bytes.Repeat([]byte{0x5A}, nvme.HashLen(hash))
	}
	if cqe := c.authSend(reply.Append(nil)); !cqe.Status.OK() {
		t.Fatalf("reply: %v", cqe.Status)
	}
	b, cqe = c.authRecv()
	if !cqe.Status.OK() {
		t.Fatalf("receive success1: %v", cqe.Status)
	}
	if f, err := nvme.ParseAuthFailure(b); err == nil {
		return &f
	}
	s1, err := nvme.ParseAuthSuccess1(b)
	if err != nil || int(s1.HL) != nvme.HashLen(hash) {
		t.Fatalf("success1 %+v: %v", s1, err)
	}
	if ctrlSecret != "" {
		ck, _ := nvme.ParseDHCHAPSecret(ctrlSecret)
		c2 := reply.C2
		if sess != nil {
			c2 = nvme.AugmentChallenge(hash, sess, c2)
		}
		want := nvme.DHCHAPResponse(hash, ck.Transform(testSubNQN), c2, 1234, tid, nvme.RoleController, testSubNQN, hostnqn)
		if !s1.RValid || !bytes.Equal(s1.R, want) {
			t.Fatalf("controller response %x, want %x", s1.R, want)
		}
		if cqe := c.authSend(nvme.AppendAuthSuccess2(nil, tid)); !cqe.Status.OK() {
			t.Fatalf("success2: %v", cqe.Status)
		}
	} else if s1.RValid {
		t.Fatal("controller response without a challenge")
	}
	return nil
}

func TestAuthGatesEveryQueue(t *testing.T) {
	secret := mustSecret(t, 32, nvme.HashSHA256)
	addr := authTarget(t, DHCHAPConfig{HostSecret: secret})
	a := dialRaw(t, addr, 0)
	cqe := a.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0)
	if !cqe.Status.OK() || cqe.DW0()&nvme.ConnectAuthReqATR == 0 {
		t.Fatalf("admin connect: status %v result %#x, want success with ATR", cqe.Status, cqe.DW0())
	}
	cntlid := uint16(cqe.DW0())
	if got := a.propGet(nvme.PropCSTS, false).Status; got != nvme.StatusAuthRequired|nvme.StatusDNR {
		t.Fatalf("property get before authentication: %v, want authentication required", got)
	}
	if got := a.identify(nvme.CNSController, 0).cqe.Status; got != nvme.StatusAuthRequired|nvme.StatusDNR {
		t.Fatalf("identify before authentication: %v", got)
	}
	if f := rawAuth(t, a, testHostNQN, secret, "", nvme.HashSHA256, nvme.DHGroupNull); f != nil {
		t.Fatalf("authentication failed: %+v", f)
	}
	a.enable()
	if r := a.identify(nvme.CNSController, 0); !r.cqe.Status.OK() {
		t.Fatalf("identify after authentication: %v", r.cqe.Status)
	}
	// the I/O queue needs its own exchange, here with ffdhe2048 and sha512
	q := dialRaw(t, addr, 0)
	cqe = q.connect(testSubNQN, testHostNQN, testHostID, 1, cntlid, 31, 0)
	if !cqe.Status.OK() || cqe.DW0()&nvme.ConnectAuthReqATR == 0 {
		t.Fatalf("I/O connect: %v %#x", cqe.Status, cqe.DW0())
	}
	if got := q.read(1, 0, 1, testBS).cqe.Status; got != nvme.StatusAuthRequired|nvme.StatusDNR {
		t.Fatalf("read before authentication: %v", got)
	}
	if got := q.writeBlocks(1, 0, make([]byte, testBS), testBS, false).cqe.Status; got != nvme.StatusAuthRequired|nvme.StatusDNR {
		t.Fatalf("write (R2T) before authentication: %v", got)
	}
	if f := rawAuth(t, q, testHostNQN, secret, "", nvme.HashSHA512, nvme.DHGroup2048); f != nil {
		t.Fatalf("I/O queue authentication failed: %+v", f)
	}
	w := bytes.Repeat([]byte{0xC3}, testBS)
	if r := q.writeBlocks(1, 3, w, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("write after authentication: %v", r.cqe.Status)
	}
	if r := q.read(1, 3, 1, testBS); !r.cqe.Status.OK() || !bytes.Equal(r.data, w) {
		t.Fatalf("read after authentication: %v", r.cqe.Status)
	}
}

func TestAuthBidirectional(t *testing.T) {
	hs, cs := mustSecret(t, 48, nvme.HashSHA384), mustSecret(t, 64, nvme.HashNone)
	addr := authTarget(t, DHCHAPConfig{HostSecret: hs, CtrlSecret: cs})
	for _, g := range []uint8{nvme.DHGroupNull, nvme.DHGroup2048} {
		a := dialRaw(t, addr, 0)
		a.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0)
		if f := rawAuth(t, a, testHostNQN, hs, cs, nvme.HashSHA256, g); f != nil {
			t.Fatalf("%s: %+v", nvme.DHGroupName(g), f)
		}
		a.enable()
	}
}

func TestAuthWrongSecretRefused(t *testing.T) {
	addr := authTarget(t, DHCHAPConfig{HostSecret: mustSecret(t, 32, nvme.HashNone)})
	for _, g := range []uint8{nvme.DHGroupNull, nvme.DHGroup2048} {
		a := dialRaw(t, addr, 0)
		a.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0)
		f := rawAuth(t, a, testHostNQN, mustSecret(t, 32, nvme.HashNone), "", nvme.HashSHA256, g)
		if f == nil || f.ID != nvme.AuthIDFailure1 || f.Explanation != nvme.AuthFailFailed || f.TID != 77 {
			t.Fatalf("%s: wrong secret got %+v, want Failure1 'failed'", nvme.DHGroupName(g), f)
		}
		a.expectClosed()
	}
}

func TestAuthProtocolErrors(t *testing.T) {
	secret := mustSecret(t, 32, nvme.HashNone)
	addr := authTarget(t, DHCHAPConfig{HostSecret: secret, Hashes: []uint8{nvme.HashSHA512}, DHGroups: []uint8{nvme.DHGroup2048}})
	connect := func() *rawClient {
		a := dialRaw(t, addr, 0)
		a.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0)
		return a
	}
	// no common hash, then no common DH group
	for _, tc := range []struct {
		hash, group uint8
		want        uint8
	}{{nvme.HashSHA256, nvme.DHGroup2048, nvme.AuthFailHashUnusable}, {nvme.HashSHA512, nvme.DHGroupNull, nvme.AuthFailDHGroupUnusable}} {
		a := connect()
		f := rawAuth(t, a, testHostNQN, secret, "", tc.hash, tc.group)
		if f == nil || f.Explanation != tc.want {
			t.Fatalf("hash %d group %d: %+v, want explanation %d", tc.hash, tc.group, f, tc.want)
		}
		a.expectClosed()
	}
	// Receive before Negotiate
	a := connect()
	b, cqe := a.authRecv()
	if f, err := nvme.ParseAuthFailure(b); !cqe.Status.OK() || err != nil || f.Explanation != nvme.AuthFailIncorrectMessage {
		t.Fatalf("receive out of sequence: %v %+v %v", cqe.Status, f, err)
	}
	a.expectClosed()
	// wrong security protocol
	a = connect()
	s := nvme.AuthCmd{Send: true, SECP: 0xEA, SPSP0: 1, SPSP1: 1, Len: 72}.SQE(0)
	if r := a.do(s, make([]byte, 72), true); r.cqe.Status != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Fatalf("SECP 0xEA: %v", r.cqe.Status)
	}
	// the controller asked to prove a secret it does not have
	a = connect()
	if f := rawAuth(t, a, testHostNQN, secret, mustSecret(t, 32, nvme.HashNone), nvme.HashSHA512, nvme.DHGroup2048); f == nil || f.Explanation != nvme.AuthFailFailed {
		t.Fatalf("bidirectional without a controller secret: %+v", f)
	}
}

func TestAuthPerHostAndAllowList(t *testing.T) {
	secret := mustSecret(t, 32, nvme.HashSHA256)
	addr := authTarget(t, DHCHAPConfig{Hosts: map[string]DHCHAPSecrets{testHostNQN: {HostSecret: secret}}})
	// host two has no secret: no authentication, as before
	a := dialRaw(t, addr, 0)
	cqe := a.connect(testSubNQN, testHostNQN2, testHostID2, 0, nvme.CntlIDDynamic, 31, 0)
	if !cqe.Status.OK() || cqe.DW0()&nvme.ConnectAuthReqATR != 0 {
		t.Fatalf("host without a secret: %v %#x", cqe.Status, cqe.DW0())
	}
	a.enable()
	// host one must authenticate
	a = dialRaw(t, addr, 0)
	if cqe := a.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0); cqe.DW0()&nvme.ConnectAuthReqATR == 0 {
		t.Fatalf("host with a secret: no ATR in %#x", cqe.DW0())
	}
	// a host not on the allow-list is refused before any authentication
	a = dialRaw(t, addr, 0)
	if cqe := a.connect(testSubNQN, "nqn.2014-08.org.nvmexpress:uuid:stranger", testHostID2, 0, nvme.CntlIDDynamic, 31, 0); cqe.Status != nvme.StatusConnectInvalidHost|nvme.StatusDNR {
		t.Fatalf("host not allowed: %v", cqe.Status)
	}
}

func TestAuthTimeout(t *testing.T) {
	old := authTimeout
	authTimeout = 200 * time.Millisecond
	t.Cleanup(func() { authTimeout = old })
	addr := authTarget(t, DHCHAPConfig{HostSecret: mustSecret(t, 32, nvme.HashNone)})
	a := dialRaw(t, addr, 0)
	a.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0)
	start := time.Now()
	a.expectClosed()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v", d)
	}
}

func TestDHCHAPConfigErrors(t *testing.T) {
	good := mustSecret(t, 32, nvme.HashNone)
	for _, dc := range []DHCHAPConfig{
		{HostSecret: "DHHC-1:00:bad:"},
		{HostSecret: good, CtrlSecret: "nope"},
		{CtrlSecret: good},
		{HostSecret: good, Hashes: []uint8{7}},
		{HostSecret: good, DHGroups: []uint8{9}},
		{Hosts: map[string]DHCHAPSecrets{"": {HostSecret: good}}},
	} {
		tg, err := New(Config{Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tg.AddSubsystem(SubsystemConfig{NQN: testSubNQN, DHCHAP: dc}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: got %v, want ErrInvalid", dc, err)
		}
		tg.Close()
	}
}

// FuzzAuthServeConn feeds arbitrary bytes as one connection of a host that
// must authenticate (seeded with a Negotiate, Receives and a Reply). The
// target must neither panic nor hang, nor open the queue without a valid
// reply, and a bystander controller keeps working.
func FuzzAuthServeConn(f *testing.F) {
	secret := nvme.DHCHAPKey{Key: make([]byte, 32)}.String()
	adm := nvme.ConnectData{HostID: testHostID2, CntlID: 0xFFFF, SubNQN: testSubNQN, HostNQN: testHostNQN2}
	neg := nvme.AuthNegotiate{TID: 1, Protocols: []nvme.DHCHAPProtocol{{AuthID: 1, Hashes: nvme.AllHashes, DHGroups: nvme.AllDHGroups}}}.Append(nil)
	recv := nvme.DHCHAPAuthCmd(false, 4096).SQE(3)
	recv.DPTR = nvme.SGL{Length: 4096, Type: nvme.SGLTypeTransport}
	reply := nvme.AuthReply{TID: 1, R: make([]byte, 32), DHV: make([]byte, 256)}.Append(nil)
	b := nvme.ICReq{}.Append(nil)
	b = append(b, capsule(nvme.ConnectCmd{SQSize: 31}.SQE(1), adm.Append(nil), 0)...)
	b = append(b, capsule(nvme.DHCHAPAuthCmd(true, len(neg)).SQE(2), neg, 0)...)
	b = append(b, capsule(recv, nil, 0)...)
	b = append(b, capsule(nvme.DHCHAPAuthCmd(true, len(reply)).SQE(4), reply, 0)...)
	recv.CID = 5
	b = append(b, capsule(recv, nil, 0)...)
	b = append(b, capsule(nvme.IdentifyCmd{CNS: nvme.CNSController}.SQE(6), nil, 0)...)
	f.Add(b)
	f.Add(b[:len(b)-200])
	old := connectTimeout
	connectTimeout = 2 * time.Second
	f.Cleanup(func() { connectTimeout = old })
	tg, addr := newTarget(f, Config{KeepAliveSweep: time.Hour, MaxDataTransfer: 64 << 10, InlineDataSize: 4096}, nil)
	if err := tg.SetDHCHAP(testSubNQN, DHCHAPConfig{Hosts: map[string]DHCHAPSecrets{testHostNQN2: {HostSecret: secret}}}); err != nil {
		f.Fatal(err)
	}
	by, _ := adminConnect(f, addr, 0, testHostNQN, testHostID)
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			tg.ServeConn(server)
			close(done)
		}()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_ = client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = client.Write(in)
		client.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("ServeConn did not return after the host closed the connection")
		}
		by.t = t
		if r, err := by.try(nvme.SQE{Opcode: nvme.AdminKeepAlive}, nil, false); err != nil || !r.cqe.Status.OK() {
			t.Fatalf("bystander controller broken: %v %v", r.cqe.Status, err)
		}
	})
}
