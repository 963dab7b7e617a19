package host

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// ErrAuth: DH-HMAC-CHAP authentication of a queue failed (wrong secret on
// either side, no common hash or DH group, or the controller requires
// authentication and no secret is configured).
var ErrAuth = errors.New("authentication failed")

// authRecvLen is the allocation length of Authentication Receive, as Linux
// uses it: enough for a Challenge with an ffdhe8192 value.
const authRecvLen = 4096

// hostKeys are the parsed secrets of Options.
type hostKeys struct {
	host *nvme.DHCHAPKey
	ctrl *nvme.DHCHAPKey
}

func parseHostKeys(o *Options) (hostKeys, error) {
	var k hostKeys
	if o.DHCHAPSecret != "" {
		hk, err := nvme.ParseDHCHAPSecret(o.DHCHAPSecret)
		if err != nil {
			return k, fmt.Errorf("Options.DHCHAPSecret: %w", err)
		}
		k.host = &hk
	}
	if o.DHCHAPCtrlSecret != "" {
		if k.host == nil {
			return k, fmt.Errorf("Options.DHCHAPCtrlSecret without DHCHAPSecret: bidirectional authentication needs the host secret too: %w", nvme.ErrSecret)
		}
		ck, err := nvme.ParseDHCHAPSecret(o.DHCHAPCtrlSecret)
		if err != nil {
			return k, fmt.Errorf("Options.DHCHAPCtrlSecret: %w", err)
		}
		k.ctrl = &ck
	}
	return k, nil
}

// authExchange is one DH-HMAC-CHAP transaction on queue q: the messages
// sent and received with Authentication Send/Receive, and the errors that
// name the controller, queue, subsystem and host.
type authExchange struct {
	c   *Controller
	q   transport.Queue
	qid uint16
	o   *Options
	tid uint16
}

func (x *authExchange) fail(format string, args ...any) error {
	return fmt.Errorf("controller %s queue %d (subsystem %q, host %q): %w: %s", x.c.addr, x.qid, x.o.SubNQN, x.o.HostNQN, ErrAuth, fmt.Sprintf(format, args...))
}

func (x *authExchange) send(msg []byte) error {
	cqe, err := submit(x.q, transport.Command{SQE: nvme.DHCHAPAuthCmd(true, len(msg)).SQE(0), Write: msg})
	if err != nil {
		return fmt.Errorf("authentication send on queue %d of %s: %w", x.qid, x.c.addr, err)
	}
	if !cqe.Status.OK() {
		return fmt.Errorf("controller %s queue %d: %w: %w", x.c.addr, x.qid, ErrAuth, &StatusError{Op: "authentication send", Status: cqe.Status})
	}
	return nil
}

// recv receives the next message, which must be DH-HMAC-CHAP message want
// of this transaction; an AUTH_Failure1 from the controller is reported
// with its explanation.
func (x *authExchange) recv(want uint8) ([]byte, error) {
	buf := make([]byte, authRecvLen)
	cqe, err := submit(x.q, transport.Command{SQE: nvme.DHCHAPAuthCmd(false, len(buf)).SQE(0), Read: buf})
	if err != nil {
		return nil, fmt.Errorf("authentication receive on queue %d of %s: %w", x.qid, x.c.addr, err)
	}
	if !cqe.Status.OK() {
		return nil, fmt.Errorf("controller %s queue %d: %w: %w", x.c.addr, x.qid, ErrAuth, &StatusError{Op: "authentication receive", Status: cqe.Status})
	}
	h, err := nvme.ParseAuthHeader(buf)
	if err != nil {
		return nil, x.fail("%v", err)
	}
	if h.Type == nvme.AuthTypeCommon && h.ID == nvme.AuthIDFailure1 {
		f, _ := nvme.ParseAuthFailure(buf)
		hint := ""
		if f.Explanation == nvme.AuthFailFailed {
			hint = "; check the secret"
		}
		return nil, x.fail("controller sent AUTH_Failure1: %s%s", nvme.AuthFailName(f.Explanation), hint)
	}
	if h.Type != nvme.AuthTypeDHCHAP || h.ID != want || h.TID != x.tid {
		return nil, x.fail("unexpected message type %#x id %#x transaction %d (wanted id %#x transaction %d)", h.Type, h.ID, h.TID, want, x.tid)
	}
	return buf, nil
}

// failure2 tells the controller the host aborts the transaction (best
// effort: the host's own error is what the caller returns).
func (x *authExchange) failure2(code uint8) {
	_ = x.send(nvme.AuthFailure{ID: nvme.AuthIDFailure2, TID: x.tid, Reason: nvme.AuthReasonFailed, Explanation: code}.Append(nil))
}

// authenticate runs DH-HMAC-CHAP on queue q right after a Connect whose
// response asked for it (ATR).
func (c *Controller) authenticate(q transport.Queue, qid uint16) error {
	o := &c.opts
	keys, err := parseHostKeys(o)
	if err != nil {
		return err
	}
	x := &authExchange{c: c, q: q, qid: qid, o: o}
	if keys.host == nil {
		return x.fail("the controller requires DH-HMAC-CHAP authentication; configure the host secret (DHHC-1:...)")
	}
	x.tid = uint16(c.authTID.Add(1))

	ch, hl, err := x.challenge()
	if err != nil {
		return err
	}
	reply, sess, err := x.reply(ch, hl, keys)
	if err != nil {
		return err
	}
	if err := x.send(reply.Append(nil)); err != nil {
		return err
	}
	b, err := x.recv(nvme.AuthIDSuccess1)
	if err != nil {
		return err
	}
	s1, err := nvme.ParseAuthSuccess1(b)
	if err != nil || int(s1.HL) != hl {
		x.failure2(nvme.AuthFailIncorrectPayload)
		return x.fail("malformed Success1 (HL %d, want %d): %v", s1.HL, hl, err)
	}
	if keys.ctrl != nil {
		if err := x.verifyController(ch, reply, sess, keys, s1); err != nil {
			return err
		}
	}
	if qid == 0 {
		c.log.Info("authenticated", "hash", nvme.HashName(ch.HashID), "dhgroup", nvme.DHGroupName(ch.DHGroup), "bidirectional", keys.ctrl != nil)
	}
	return nil
}

// challenge sends the Negotiate and receives the controller's Challenge,
// checking its hash; it returns the challenge and the hash length.
func (x *authExchange) challenge() (nvme.AuthChallenge, int, error) {
	neg := nvme.AuthNegotiate{TID: x.tid, Protocols: []nvme.DHCHAPProtocol{{AuthID: nvme.AuthProtocolDHCHAP, Hashes: nvme.AllHashes, DHGroups: nvme.AllDHGroups}}}
	if err := x.send(neg.Append(nil)); err != nil {
		return nvme.AuthChallenge{}, 0, err
	}
	b, err := x.recv(nvme.AuthIDChallenge)
	if err != nil {
		return nvme.AuthChallenge{}, 0, err
	}
	ch, err := nvme.ParseAuthChallenge(b)
	if err != nil {
		x.failure2(nvme.AuthFailIncorrectPayload)
		return ch, 0, x.fail("%v", err)
	}
	hl := nvme.HashLen(ch.HashID)
	if hl == 0 || len(ch.C) != hl {
		x.failure2(nvme.AuthFailHashUnusable)
		return ch, 0, x.fail("challenge with hash %d and %d-byte value", ch.HashID, len(ch.C))
	}
	return ch, hl, nil
}

// reply computes the host's Reply to challenge ch: the DH exchange when the
// controller chose a group (sess is then the shared secret), the host's
// response and, with a controller secret, the host's own challenge.
func (x *authExchange) reply(ch nvme.AuthChallenge, hl int, keys hostKeys) (reply nvme.AuthReply, sess []byte, err error) {
	o := x.o
	reply = nvme.AuthReply{TID: x.tid}
	chal := ch.C
	switch {
	case ch.DHGroup == nvme.DHGroupNull && len(ch.DHV) == 0:
	case ch.DHGroup != nvme.DHGroupNull && len(ch.DHV) == nvme.DHGroupSize(ch.DHGroup) && len(ch.DHV) > 0:
		dh, err := nvme.NewDH(ch.DHGroup, nil)
		if err != nil {
			x.failure2(nvme.AuthFailDHGroupUnusable)
			return reply, nil, x.fail("%v", err)
		}
		if sess, err = dh.Shared(ch.DHV); err != nil {
			x.failure2(nvme.AuthFailDHGroupUnusable)
			return reply, nil, x.fail("%v", err)
		}
		reply.DHV = dh.Public
		chal = nvme.AugmentChallenge(ch.HashID, sess, ch.C)
	default:
		x.failure2(nvme.AuthFailDHGroupUnusable)
		return reply, nil, x.fail("challenge with DH group %s and a %d-byte DH value", nvme.DHGroupName(ch.DHGroup), len(ch.DHV))
	}
	reply.R = nvme.DHCHAPResponse(ch.HashID, keys.host.Transform(o.HostNQN), chal, ch.Seq, x.tid, nvme.RoleHost, o.HostNQN, o.SubNQN)
	if keys.ctrl != nil {
		reply.CValid = true
		reply.C2 = make([]byte, hl)
		var s [4]byte
		if _, err := rand.Read(reply.C2); err != nil {
			return reply, nil, err
		}
		_, _ = rand.Read(s[:])
		reply.Seq = binary.LittleEndian.Uint32(s[:]) | 1
	}
	return reply, sess, nil
}

// verifyController checks the controller's response in Success1 to the
// host's challenge (bidirectional authentication) and sends Success2.
func (x *authExchange) verifyController(ch nvme.AuthChallenge, reply nvme.AuthReply, sess []byte, keys hostKeys, s1 nvme.AuthSuccess1) error {
	o := x.o
	c2 := reply.C2
	if sess != nil {
		c2 = nvme.AugmentChallenge(ch.HashID, sess, reply.C2)
	}
	want := nvme.DHCHAPResponse(ch.HashID, keys.ctrl.Transform(o.SubNQN), c2, reply.Seq, x.tid, nvme.RoleController, o.SubNQN, o.HostNQN)
	if !s1.RValid || !hmac.Equal(want, s1.R) {
		x.failure2(nvme.AuthFailFailed)
		return x.fail("the controller did not prove the controller secret; check the controller secret")
	}
	return x.send(nvme.AppendAuthSuccess2(nil, x.tid))
}
