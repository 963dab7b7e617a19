package target

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"tier0/daemon/nvme"
)

// NVMe in-band authentication (DH-HMAC-CHAP, NVMe Base 2.0 §8.13) on the
// target side.
//
// A subsystem with a DHCHAPConfig requires the hosts it has a secret for to
// authenticate every queue: Connect succeeds with the ATR bit set in its
// response, and until the exchange on that queue has succeeded the queue
// accepts only Authentication Send/Receive and Disconnect (anything else
// fails with status 0x191, authentication required). The exchange:
//
//	host → AUTH_Negotiate (hashes, DH groups)  [Authentication Send]
//	host ← DH-HMAC-CHAP_Challenge (C1, S1, DH value)  [Authentication Receive]
//	host → DH-HMAC-CHAP_Reply (R1, optional C2/S2, DH value)
//	host ← DH-HMAC-CHAP_Success1 (R2 when C2 was sent) or AUTH_Failure1
//	host → DH-HMAC-CHAP_Success2 (bidirectional only) or AUTH_Failure2
//
// A wrong response gets AUTH_Failure1 and the connection is closed after
// it (on the admin queue that ends the controller). A host that does not
// finish within authTimeout of its Connect is disconnected. The allow-list
// is checked first, as without authentication.

// authTimeout bounds the time from Connect to a finished authentication.
var authTimeout = 10 * time.Second

// DHCHAPSecrets are the secrets of one host: HostSecret is what the host
// must prove (required); CtrlSecret, when set, is what this controller
// proves to a host that asks for bidirectional authentication. Both are in
// the DHHC-1 representation (`nvme gen-dhchap-key`).
type DHCHAPSecrets struct {
	HostSecret string
	CtrlSecret string
}

// DHCHAPConfig turns on DH-HMAC-CHAP authentication for a subsystem.
type DHCHAPConfig struct {
	// HostSecret and CtrlSecret apply to every host without an entry in
	// Hosts. With HostSecret empty, only the hosts in Hosts authenticate.
	HostSecret string
	CtrlSecret string
	// Hosts gives per-host-NQN secrets; an entry replaces both defaults.
	Hosts map[string]DHCHAPSecrets
	// Hashes and DHGroups are the acceptable hash functions and DH groups
	// (nvme.Hash*, nvme.DHGroup*) in order of preference; the first one the
	// host also offers is used. Defaults: sha256, sha384, sha512 and
	// ffdhe2048, 3072, 4096, 6144, 8192, null.
	Hashes   []uint8
	DHGroups []uint8
}

// enabled reports whether cfg asks for authentication at all.
func (cfg DHCHAPConfig) enabled() bool { return cfg.HostSecret != "" || len(cfg.Hosts) > 0 }

type dhchapKeys struct {
	host nvme.DHCHAPKey
	ctrl *nvme.DHCHAPKey
}

// dhchapPolicy is a parsed DHCHAPConfig.
type dhchapPolicy struct {
	def    *dhchapKeys
	hosts  map[string]*dhchapKeys
	hashes []uint8
	groups []uint8
}

func parseKeys(s DHCHAPSecrets, who string) (*dhchapKeys, error) {
	hk, err := nvme.ParseDHCHAPSecret(s.HostSecret)
	if err != nil {
		return nil, fmt.Errorf("%s host secret: %w: %w", who, err, ErrInvalid)
	}
	k := &dhchapKeys{host: hk}
	if s.CtrlSecret != "" {
		ck, err := nvme.ParseDHCHAPSecret(s.CtrlSecret)
		if err != nil {
			return nil, fmt.Errorf("%s controller secret: %w: %w", who, err, ErrInvalid)
		}
		k.ctrl = &ck
	}
	return k, nil
}

// parseDHCHAP validates cfg; it returns nil when authentication is off.
func parseDHCHAP(cfg DHCHAPConfig) (*dhchapPolicy, error) {
	if !cfg.enabled() {
		if cfg.CtrlSecret != "" {
			return nil, fmt.Errorf("DH-HMAC-CHAP controller secret without a host secret: give the host secret too (bidirectional authentication needs both): %w", ErrInvalid)
		}
		return nil, nil
	}
	p := &dhchapPolicy{hosts: map[string]*dhchapKeys{}, hashes: cfg.Hashes, groups: cfg.DHGroups}
	if cfg.HostSecret != "" {
		k, err := parseKeys(DHCHAPSecrets{cfg.HostSecret, cfg.CtrlSecret}, "default")
		if err != nil {
			return nil, err
		}
		p.def = k
	} else if cfg.CtrlSecret != "" {
		return nil, fmt.Errorf("DH-HMAC-CHAP controller secret without a default host secret: put it in the Hosts entries: %w", ErrInvalid)
	}
	for h, s := range cfg.Hosts {
		if err := validNQN(h); err != nil {
			return nil, fmt.Errorf("DH-HMAC-CHAP host: %w", err)
		}
		k, err := parseKeys(s, "host "+h)
		if err != nil {
			return nil, err
		}
		p.hosts[h] = k
	}
	if len(p.hashes) == 0 {
		p.hashes = nvme.AllHashes
	}
	if len(p.groups) == 0 {
		p.groups = []uint8{nvme.DHGroup2048, nvme.DHGroup3072, nvme.DHGroup4096, nvme.DHGroup6144, nvme.DHGroup8192, nvme.DHGroupNull}
	}
	for _, h := range p.hashes {
		if nvme.HashLen(h) == 0 {
			return nil, fmt.Errorf("DH-HMAC-CHAP hash %d: want 1 (sha256), 2 (sha384) or 3 (sha512): %w", h, ErrInvalid)
		}
	}
	for _, g := range p.groups {
		if g != nvme.DHGroupNull && nvme.DHGroupSize(g) == 0 {
			return nil, fmt.Errorf("DH-HMAC-CHAP DH group %d: want 0 (null) .. 5 (ffdhe8192): %w", g, ErrInvalid)
		}
	}
	return p, nil
}

func (p *dhchapPolicy) keysFor(hostNQN string) *dhchapKeys {
	if p == nil {
		return nil
	}
	if k, ok := p.hosts[hostNQN]; ok {
		return k
	}
	return p.def
}

// SetDHCHAP replaces a subsystem's authentication settings (a zero config
// turns authentication off). Queues connected before keep their state; new
// queues use the new settings.
func (t *Target) SetDHCHAP(subnqn string, cfg DHCHAPConfig) error {
	p, err := parseDHCHAP(cfg)
	if err != nil {
		return err
	}
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.auth = p
	s.mu.Unlock()
	t.log.Info("subsystem authentication set", "subnqn", subnqn, "enabled", p != nil)
	return nil
}

// Exchange steps: what the controller expects next.
const (
	stepNegotiate = iota // Send: AUTH_Negotiate
	stepChallenge        // Receive: Challenge
	stepReply            // Send: Reply
	stepSuccess1         // Receive: Success1
	stepSuccess2         // Send: Success2
	stepFailure1         // Receive: Failure1, then close
	stepDone
)

// connAuth is one queue's authentication. ok is read by every command of
// the queue; the rest only by the connection's reader goroutine, which
// runs all fabrics commands.
type connAuth struct {
	ok      atomic.Bool
	keys    *dhchapKeys
	hashes  []uint8
	groups  []uint8
	hostNQN string
	subNQN  string

	step   int
	tid    uint16
	hash   uint8
	group  uint8
	s1, s2 uint32
	c1, c2 []byte
	dh     *nvme.DH
	sess   []byte
	fail   uint8
}

// admits reports whether the queue may run command s.
func (a *connAuth) admits(s *nvme.SQE) bool {
	if a.ok.Load() {
		return true
	}
	if s.Opcode != nvme.AdminFabrics {
		return false
	}
	ft := s.FCType()
	return ft == nvme.FabricsAuthSend || ft == nvme.FabricsAuthRecv || ft == nvme.FabricsDisconnect
}

// requireAuth is called after a successful Connect of c: when the host has
// a secret on sub it marks the queue unauthenticated and sets ATR in the
// Connect response.
func (t *Target) requireAuth(c *conn, sub *subsystem, hostNQN string, r *request) {
	if sub.disc {
		return
	}
	sub.mu.RLock()
	p := sub.auth
	sub.mu.RUnlock()
	k := p.keysFor(hostNQN)
	if k == nil {
		return
	}
	c.auth = &connAuth{keys: k, hashes: p.hashes, groups: p.groups, hostNQN: hostNQN, subNQN: sub.nqn}
	r.cqe.Result |= uint64(nvme.ConnectAuthReqATR)
	_ = c.nc.SetReadDeadline(time.Now().Add(authTimeout))
}

func checkAuthCmd(s *nvme.SQE) (nvme.AuthCmd, nvme.Status) {
	a := nvme.ParseAuthCmd(s)
	if a.SECP != nvme.AuthSECP || a.SPSP0 != nvme.AuthSPSP0 || a.SPSP1 != nvme.AuthSPSP1 || a.Len == 0 {
		return a, nvme.StatusInvalidField | nvme.StatusDNR
	}
	return a, nvme.StatusSuccess
}

func (a *connAuth) failWith(code uint8) {
	a.step, a.fail = stepFailure1, code
}

// authSend handles Authentication Send.
func (t *Target) authSend(r *request) nvme.Status {
	c := r.c
	a := c.auth
	if a == nil {
		return nvme.StatusInvalidField | nvme.StatusDNR // no authentication configured for this host
	}
	cmd, st := checkAuthCmd(&r.sqe)
	if st != nvme.StatusSuccess {
		return st
	}
	if uint32(len(r.data)) != cmd.Len {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	h, err := nvme.ParseAuthHeader(r.data)
	if err != nil {
		a.failWith(nvme.AuthFailIncorrectPayload)
		return nvme.StatusSuccess
	}
	switch {
	case h.Type == nvme.AuthTypeCommon && h.ID == nvme.AuthIDNegotiate:
		a.negotiate(r.data)
	case h.Type == nvme.AuthTypeCommon && h.ID == nvme.AuthIDFailure2:
		f, _ := nvme.ParseAuthFailure(r.data)
		t.warnLimited("auth-failure2:"+a.hostNQN, "host rejected the controller's authentication (check the controller secret)",
			"subnqn", a.subNQN, "hostnqn", a.hostNQN, "qid", c.qid, "reason", nvme.AuthFailName(f.Explanation), "remote", c.remote())
		a.ok.Store(false)
		a.step = stepDone
		r.closeConn = true
	case h.Type != nvme.AuthTypeDHCHAP || h.TID != a.tid:
		a.failWith(nvme.AuthFailIncorrectMessage)
	case h.ID == nvme.AuthIDReply && a.step == stepReply:
		a.reply(r.data)
	case h.ID == nvme.AuthIDSuccess2 && a.step == stepSuccess2:
		t.authenticated(c)
	default:
		a.failWith(nvme.AuthFailIncorrectMessage)
	}
	return nvme.StatusSuccess
}

func (a *connAuth) negotiate(b []byte) {
	m, err := nvme.ParseAuthNegotiate(b)
	// a new transaction (also a re-authentication) starts from scratch
	a.step, a.tid, a.hash, a.group, a.fail = stepNegotiate, 0, 0, 0, 0
	a.s1, a.s2, a.c1, a.c2, a.dh, a.sess = 0, 0, nil, nil, nil, nil
	if err != nil {
		a.failWith(nvme.AuthFailIncorrectPayload)
		return
	}
	a.tid = m.TID
	if m.SCC != 0 {
		a.failWith(nvme.AuthFailConcatMismatch)
		return
	}
	var proto *nvme.DHCHAPProtocol
	for i := range m.Protocols {
		if m.Protocols[i].AuthID == nvme.AuthProtocolDHCHAP {
			proto = &m.Protocols[i]
			break
		}
	}
	if proto == nil {
		a.failWith(nvme.AuthFailNotUsable)
		return
	}
	i := slices.IndexFunc(a.hashes, func(h uint8) bool { return slices.Contains(proto.Hashes, h) })
	if i < 0 {
		a.failWith(nvme.AuthFailHashUnusable)
		return
	}
	a.hash = a.hashes[i]
	i = slices.IndexFunc(a.groups, func(g uint8) bool { return slices.Contains(proto.DHGroups, g) })
	if i < 0 {
		a.failWith(nvme.AuthFailDHGroupUnusable)
		return
	}
	a.group = a.groups[i]
	a.step = stepChallenge
}

func (a *connAuth) reply(b []byte) {
	m, err := nvme.ParseAuthReply(b)
	hl := nvme.HashLen(a.hash)
	if err != nil || len(m.R) != hl {
		a.failWith(nvme.AuthFailIncorrectPayload)
		return
	}
	chal := a.c1
	if a.group != nvme.DHGroupNull {
		if len(m.DHV) != nvme.DHGroupSize(a.group) {
			a.failWith(nvme.AuthFailIncorrectPayload)
			return
		}
		a.sess, err = a.dh.Shared(m.DHV)
		if err != nil {
			a.failWith(nvme.AuthFailDHGroupUnusable)
			return
		}
		chal = nvme.AugmentChallenge(a.hash, a.sess, a.c1)
	} else if len(m.DHV) != 0 {
		a.failWith(nvme.AuthFailIncorrectPayload)
		return
	}
	want := nvme.DHCHAPResponse(a.hash, a.keys.host.Transform(a.hostNQN), chal, a.s1, a.tid, nvme.RoleHost, a.hostNQN, a.subNQN)
	if !hmac.Equal(want, m.R) {
		a.failWith(nvme.AuthFailFailed)
		return
	}
	if m.CValid && m.Seq != 0 {
		if a.keys.ctrl == nil {
			// the host wants the controller to prove a secret it does not have
			a.failWith(nvme.AuthFailFailed)
			return
		}
		a.s2, a.c2 = m.Seq, m.C2
	}
	a.step = stepSuccess1
}

// authRecv handles Authentication Receive.
func (t *Target) authRecv(r *request) nvme.Status {
	c := r.c
	a := c.auth
	if a == nil {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	cmd, st := checkAuthCmd(&r.sqe)
	if st != nvme.StatusSuccess {
		return st
	}
	var msg []byte
	switch a.step {
	case stepChallenge:
		hl := nvme.HashLen(a.hash)
		a.c1 = make([]byte, hl)
		var s [4]byte
		if _, err := rand.Read(a.c1); err != nil {
			return nvme.StatusInternal
		}
		_, _ = rand.Read(s[:])
		a.s1 = binary.LittleEndian.Uint32(s[:]) | 1
		ch := nvme.AuthChallenge{TID: a.tid, HashID: a.hash, DHGroup: a.group, Seq: a.s1, C: a.c1}
		if a.group != nvme.DHGroupNull {
			dh, err := nvme.NewDH(a.group, nil)
			if err != nil {
				return nvme.StatusInternal
			}
			a.dh, ch.DHV = dh, dh.Public
		}
		msg = ch.Append(nil)
		a.step = stepReply
	case stepSuccess1:
		hl := nvme.HashLen(a.hash)
		s1 := nvme.AuthSuccess1{TID: a.tid, HL: uint8(hl)}
		if a.c2 != nil {
			chal := a.c2
			if a.group != nvme.DHGroupNull {
				chal = nvme.AugmentChallenge(a.hash, a.sess, a.c2)
			}
			s1.RValid = true
			s1.R = nvme.DHCHAPResponse(a.hash, a.keys.ctrl.Transform(a.subNQN), chal, a.s2, a.tid, nvme.RoleController, a.subNQN, a.hostNQN)
			a.step = stepSuccess2
		}
		msg = s1.Append(nil)
		if a.c2 == nil {
			t.authenticated(c)
		}
	default:
		// Failure1: for a failed step, or a Receive out of sequence
		code := a.fail
		if a.step != stepFailure1 || code == 0 {
			code = nvme.AuthFailIncorrectMessage
		}
		msg = nvme.AuthFailure{ID: nvme.AuthIDFailure1, TID: a.tid, Reason: nvme.AuthReasonFailed, Explanation: code}.Append(nil)
		t.warnLimited("auth-fail:"+a.hostNQN, "host authentication failed; closing the queue (check the host's DH-HMAC-CHAP secret)",
			"subnqn", a.subNQN, "hostnqn", a.hostNQN, "qid", c.qid, "reason", nvme.AuthFailName(code), "remote", c.remote())
		a.ok.Store(false)
		a.step = stepDone
		r.closeConn = true
	}
	if int(cmd.Len) < len(msg) {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	// Linux's target returns AL bytes; pad the message the same way.
	out := msg
	if n := int(cmd.Len); n > len(msg) && n <= 64<<10 {
		out = make([]byte, n)
		copy(out, msg)
	}
	r.sendData(out)
	return nvme.StatusSuccess
}

// authenticated opens the queue for all commands.
func (t *Target) authenticated(c *conn) {
	a := c.auth
	a.step = stepDone
	a.ok.Store(true)
	a.dh, a.sess = nil, nil
	_ = c.nc.SetReadDeadline(time.Time{})
	if c.qid == 0 {
		t.log.Info("host authenticated", "subnqn", a.subNQN, "hostnqn", a.hostNQN, "hash", nvme.HashName(a.hash),
			"dhgroup", nvme.DHGroupName(a.group), "bidirectional", a.c2 != nil, "remote", c.remote())
	}
}
