package target

import (
	"errors"
	"math"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// lendMin is the smallest read for which the target borrows the memory
// of a device that lends it (blockdev.Lender) instead of having it copy:
// below it the loan costs about what the copy does.
const lendMin = 16 << 10

// lendReads turns lending on (a variable so that a test can set it). Off
// in session 6: with spdk_nvme_perf as the client a lending target served
// 128 KiB reads of a 512 MiB memory namespace at a fifth of a copying
// one's bandwidth. The cause was the kernel's copy out of 4 KiB pages of a
// large namespace on this project's virtual machines; local.Memory now
// lies on transparent huge pages and lending wins (docs/PERFORMANCE.md).
var lendReads = true

// io executes an NVM command set command on an I/O queue.
func (t *Target) io(r *request) nvme.Status {
	c := r.c.ctrl
	s := &r.sqe
	switch s.Opcode {
	case nvme.CmdRead, nvme.CmdWrite, nvme.CmdFlush, nvme.CmdWriteZeroes, nvme.CmdDSM,
		nvme.CmdResvRegister, nvme.CmdResvReport, nvme.CmdResvAcquire, nvme.CmdResvRelease:
	default:
		return nvme.StatusInvalidOpcode | nvme.StatusDNR
	}
	if s.Opcode == nvme.CmdFlush && s.NSID == 0xFFFFFFFF {
		for _, id := range c.nsids() {
			if ns := c.namespace(id); ns != nil {
				if st := t.nsCommand(r, c, ns); !st.OK() {
					return st
				}
			}
		}
		return nvme.StatusSuccess
	}
	ns := c.namespace(s.NSID)
	if ns == nil {
		return nvme.StatusInvalidNS | nvme.StatusDNR
	}
	return t.nsCommand(r, c, ns)
}

func (t *Target) nsCommand(r *request, c *controller, ns *namespace) nvme.Status {
	s := &r.sqe
	// Reservation commands act on the subsystem's state, the same on
	// every path: they are served whatever this path's ANA state.
	switch s.Opcode {
	case nvme.CmdResvRegister, nvme.CmdResvAcquire, nvme.CmdResvRelease:
		return ns.resv.modify(t, r, c)
	case nvme.CmdResvReport:
		return ns.resv.report(r, c)
	}
	if st := c.sub.anaStateOf(ns.group).IOStatus(); !st.OK() {
		return st
	}
	write := s.Opcode != nvme.CmdRead
	ns.resv.gate.RLock()
	defer ns.resv.gate.RUnlock()
	if ns.removed.Load() {
		return nvme.StatusInvalidNS | nvme.StatusDNR
	}
	if !ns.resv.allowsLocked(c.hostID, write) {
		return nvme.StatusReservationConflict | nvme.StatusDNR
	}
	bs := uint64(ns.bs)
	nblocks := uint64(ns.dev.Size()) / bs
	switch s.Opcode {
	case nvme.CmdFlush:
		return t.devStatus(ns, "flush", ns.dev.Flush())
	case nvme.CmdRead, nvme.CmdWrite, nvme.CmdWriteZeroes:
		slba, nlb := s.SLBA(), uint64(s.NLB())
		if slba > math.MaxUint64-nlb || slba+nlb > nblocks {
			return nvme.StatusLBARange | nvme.StatusDNR
		}
		off, n := int64(slba*bs), nlb*bs
		if s.Opcode == nvme.CmdWriteZeroes {
			op, err := "write zeroes", error(nil)
			if s.CDW12&nvme.CmdWriteZeroesDeac != 0 {
				op, err = "write zeroes (deallocate)", ns.dev.Discard(off, int64(n))
			} else {
				err = ns.dev.WriteZeroes(off, int64(n))
			}
			if err == nil && s.CDW12&nvme.CmdWriteFUABit != 0 {
				// FUA: durable before the completion, like a write
				err = ns.dev.Flush()
			}
			return t.devStatus(ns, op, err)
		}
		if n > uint64(t.cfg.MaxDataTransfer) {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		if uint64(s.DPTR.Length) != n {
			return nvme.StatusSGLInvalidData | nvme.StatusDNR
		}
		if s.Opcode == nvme.CmdRead {
			if l, ok := ns.dev.(blockdev.Lender); ok && lendReads && r.c.rd == nil && n >= lendMin {
				// the device's own memory goes to the socket (writeItems)
				loan, iov, err := l.LendAt(r.lent[:0], off, int64(n))
				if err != nil {
					return t.devStatus(ns, "read", err)
				}
				r.loan, r.iov, r.sendLen = loan, iov, int(n)
				ns.reads.Add(1)
				ns.readBytes.Add(n)
				return nvme.StatusSuccess
			}
			r.buf = t.pools.get(int(n))
			r.data = r.buf.b
			if _, err := ns.dev.ReadAt(r.data, off); err != nil {
				return t.devStatus(ns, "read", err)
			}
			r.sendLen = int(n)
			ns.reads.Add(1)
			ns.readBytes.Add(n)
			return nvme.StatusSuccess
		}
		if uint64(len(r.data)) != n {
			return nvme.StatusSGLInvalidData | nvme.StatusDNR
		}
		var err error
		if fw, ok := ns.dev.(blockdev.FUAWriter); ok && s.CDW12&nvme.CmdWriteFUABit != 0 {
			_, err = fw.WriteAtFUA(r.data, off)
		} else {
			_, err = ns.dev.WriteAt(r.data, off)
			if err == nil && s.CDW12&nvme.CmdWriteFUABit != 0 {
				err = ns.dev.Flush()
			}
		}
		if err != nil {
			return t.devStatus(ns, "write", err)
		}
		ns.writes.Add(1)
		ns.writtenBytes.Add(n)
		return nvme.StatusSuccess
	case nvme.CmdDSM:
		nr := int(s.CDW10&0xFF) + 1
		ranges, err := nvme.ParseDSMRanges(r.data, nr)
		if err != nil {
			return nvme.StatusSGLInvalidData | nvme.StatusDNR
		}
		if s.CDW11&nvme.DSMDeallocate == 0 {
			return nvme.StatusSuccess
		}
		for _, rg := range ranges {
			if uint64(rg.NLB) > nblocks || rg.SLBA > nblocks-uint64(rg.NLB) {
				return nvme.StatusLBARange | nvme.StatusDNR
			}
		}
		for _, rg := range ranges {
			if rg.NLB == 0 {
				continue
			}
			if err := ns.dev.Discard(int64(rg.SLBA*bs), int64(uint64(rg.NLB)*bs)); err != nil {
				return t.devStatus(ns, "deallocate", err)
			}
		}
		return nvme.StatusSuccess
	}
	return nvme.StatusInvalidOpcode | nvme.StatusDNR
}

// devStatus maps a blockdev error to an NVMe status.
func (t *Target) devStatus(ns *namespace, op string, err error) nvme.Status {
	if err == nil {
		return nvme.StatusSuccess
	}
	var st nvme.Status
	switch {
	case errors.Is(err, blockdev.ErrOutOfRange):
		st = nvme.StatusLBARange | nvme.StatusDNR
	case errors.Is(err, blockdev.ErrMisaligned):
		st = nvme.StatusInvalidField | nvme.StatusDNR
	case errors.Is(err, blockdev.ErrFenced), errors.Is(err, blockdev.ErrNoPath):
		// This node can no longer write the volume: let the host fail over.
		st = nvme.StatusANAInaccessible
	case errors.Is(err, blockdev.ErrTimeout):
		st = nvme.StatusCmdInterrupted
	case errors.Is(err, blockdev.ErrClosed):
		st = nvme.StatusNSNotReady
	case op == "read":
		st = nvme.StatusReadError
	case op == "write":
		st = nvme.StatusWriteFault
	default:
		st = nvme.StatusInternal
	}
	t.warnLimited("dev:"+ns.sub.nqn+op, "namespace I/O failed", "subnqn", ns.sub.nqn, "nsid", ns.id, "op", op, "err", err, "status", st.String())
	return st
}
