package host

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"tier0/daemon/nvme"
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

// authenticate runs DH-HMAC-CHAP on queue q right after a Connect whose
// response asked for it (ATR).
func (c *Controller) authenticate(q *queue, qid uint16) error {
	o := &c.opts
	keys, err := parseHostKeys(o)
	if err != nil {
		return err
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("controller %s queue %d (subsystem %q, host %q): %w: %s", c.addr, qid, o.SubNQN, o.HostNQN, ErrAuth, fmt.Sprintf(format, args...))
	}
	if keys.host == nil {
		return fail("the controller requires DH-HMAC-CHAP authentication; configure the host secret (DHHC-1:...)")
	}
	tid := uint16(c.authTID.Add(1))
	send := func(msg []byte) error {
		cqe, err := q.submit(&cmd{sqe: nvme.DHCHAPAuthCmd(true, len(msg)).SQE(0), wdata: msg})
		if err != nil {
			return fmt.Errorf("authentication send on queue %d of %s: %w", qid, c.addr, err)
		}
		if !cqe.Status.OK() {
			return fmt.Errorf("controller %s queue %d: %w: %w", c.addr, qid, ErrAuth, &StatusError{Op: "authentication send", Status: cqe.Status})
		}
		return nil
	}
	recv := func(want uint8) ([]byte, error) {
		buf := make([]byte, authRecvLen)
		cqe, err := q.submit(&cmd{sqe: nvme.DHCHAPAuthCmd(false, len(buf)).SQE(0), rdata: buf})
		if err != nil {
			return nil, fmt.Errorf("authentication receive on queue %d of %s: %w", qid, c.addr, err)
		}
		if !cqe.Status.OK() {
			return nil, fmt.Errorf("controller %s queue %d: %w: %w", c.addr, qid, ErrAuth, &StatusError{Op: "authentication receive", Status: cqe.Status})
		}
		h, err := nvme.ParseAuthHeader(buf)
		if err != nil {
			return nil, fail("%v", err)
		}
		if h.Type == nvme.AuthTypeCommon && h.ID == nvme.AuthIDFailure1 {
			f, _ := nvme.ParseAuthFailure(buf)
			hint := ""
			if f.Explanation == nvme.AuthFailFailed {
				hint = "; check the secret"
			}
			return nil, fail("controller sent AUTH_Failure1: %s%s", nvme.AuthFailName(f.Explanation), hint)
		}
		if h.Type != nvme.AuthTypeDHCHAP || h.ID != want || h.TID != tid {
			return nil, fail("unexpected message type %#x id %#x transaction %d (wanted id %#x transaction %d)", h.Type, h.ID, h.TID, want, tid)
		}
		return buf, nil
	}
	failure2 := func(code uint8) {
		_ = send(nvme.AuthFailure{ID: nvme.AuthIDFailure2, TID: tid, Reason: nvme.AuthReasonFailed, Explanation: code}.Append(nil))
	}

	neg := nvme.AuthNegotiate{TID: tid, Protocols: []nvme.DHCHAPProtocol{{AuthID: nvme.AuthProtocolDHCHAP, Hashes: nvme.AllHashes, DHGroups: nvme.AllDHGroups}}}
	if err := send(neg.Append(nil)); err != nil {
		return err
	}
	b, err := recv(nvme.AuthIDChallenge)
	if err != nil {
		return err
	}
	ch, err := nvme.ParseAuthChallenge(b)
	if err != nil {
		failure2(nvme.AuthFailIncorrectPayload)
		return fail("%v", err)
	}
	hl := nvme.HashLen(ch.HashID)
	if hl == 0 || len(ch.C) != hl {
		failure2(nvme.AuthFailHashUnusable)
		return fail("challenge with hash %d and %d-byte value", ch.HashID, len(ch.C))
	}
	reply := nvme.AuthReply{TID: tid}
	chal := ch.C
	var sess []byte
	switch {
	case ch.DHGroup == nvme.DHGroupNull && len(ch.DHV) == 0:
	case ch.DHGroup != nvme.DHGroupNull && len(ch.DHV) == nvme.DHGroupSize(ch.DHGroup) && len(ch.DHV) > 0:
		dh, err := nvme.NewDH(ch.DHGroup, nil)
		if err != nil {
			failure2(nvme.AuthFailDHGroupUnusable)
			return fail("%v", err)
		}
		if sess, err = dh.Shared(ch.DHV); err != nil {
			failure2(nvme.AuthFailDHGroupUnusable)
			return fail("%v", err)
		}
		reply.DHV = dh.Public
		chal = nvme.AugmentChallenge(ch.HashID, sess, ch.C)
	default:
		failure2(nvme.AuthFailDHGroupUnusable)
		return fail("challenge with DH group %s and a %d-byte DH value", nvme.DHGroupName(ch.DHGroup), len(ch.DHV))
	}
	reply.R = nvme.DHCHAPResponse(ch.HashID, keys.host.Transform(o.HostNQN), chal, ch.Seq, tid, nvme.RoleHost, o.HostNQN, o.SubNQN)
	if keys.ctrl != nil {
		reply.CValid = true
		reply.C2 = make([]byte, hl)
		var s [4]byte
		if _, err := rand.Read(reply.C2); err != nil {
			return err
		}
		_, _ = rand.Read(s[:])
		reply.Seq = binary.LittleEndian.Uint32(s[:]) | 1
	}
	if err := send(reply.Append(nil)); err != nil {
		return err
	}
	b, err = recv(nvme.AuthIDSuccess1)
	if err != nil {
		return err
	}
	s1, err := nvme.ParseAuthSuccess1(b)
	if err != nil || int(s1.HL) != hl {
		failure2(nvme.AuthFailIncorrectPayload)
		return fail("malformed Success1 (HL %d, want %d): %v", s1.HL, hl, err)
	}
	if keys.ctrl != nil {
		c2 := reply.C2
		if sess != nil {
			c2 = nvme.AugmentChallenge(ch.HashID, sess, reply.C2)
		}
		want := nvme.DHCHAPResponse(ch.HashID, keys.ctrl.Transform(o.SubNQN), c2, reply.Seq, tid, nvme.RoleController, o.SubNQN, o.HostNQN)
		if !s1.RValid || !hmac.Equal(want, s1.R) {
			failure2(nvme.AuthFailFailed)
			return fail("the controller did not prove the controller secret; check the controller secret")
		}
		if err := send(nvme.AppendAuthSuccess2(nil, tid)); err != nil {
			return err
		}
	}
	if qid == 0 {
		c.log.Info("authenticated", "hash", nvme.HashName(ch.HashID), "dhgroup", nvme.DHGroupName(ch.DHGroup), "bidirectional", keys.ctrl != nil)
	}
	return nil
}
