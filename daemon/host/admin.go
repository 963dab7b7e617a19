package host

import (
	"context"
	"fmt"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// AEN is an asynchronous event reported by the controller.
type AEN struct {
	Type    uint8 // nvme.AENType*
	Info    uint8 // e.g. nvme.AENNoticeANAChange
	LogPage uint8 // the log page that tells more
}

// fabricsConnect sends Connect on q and returns the controller ID.
func (c *Controller) fabricsConnect(q transport.Queue, qid, sqsize uint16, kato uint32, cntlid uint16) (uint16, error) {
	d := nvme.ConnectData{HostID: c.opts.HostID, CntlID: cntlid, SubNQN: c.opts.SubNQN, HostNQN: c.opts.HostNQN}
	data := d.Append(make([]byte, 0, nvme.ConnectDataLen))
	sqe := nvme.ConnectCmd{QID: qid, SQSize: sqsize, KATO: kato}.SQE(0)
	cqe, err := submit(q, transport.Command{SQE: sqe, Write: data, InCapsule: true})
	if err != nil {
		return 0, fmt.Errorf("connect queue %d to %s: %w", qid, c.addr, err)
	}
	if !cqe.Status.OK() {
		return 0, fmt.Errorf("controller %s refused connect of queue %d (subsystem %q, host %q): %w", c.addr, qid, c.opts.SubNQN, c.opts.HostNQN,
			&StatusError{Op: "connect", Status: cqe.Status})
	}
	if cqe.DW0()&nvme.ConnectAuthReqATR != 0 {
		if err := c.authenticate(q, qid); err != nil {
			return 0, err
		}
	}
	return uint16(cqe.DW0()), nil
}

func (c *Controller) propGet(q transport.Queue, off uint32, size8 bool) (uint64, error) {
	cqe, err := submit(q, transport.Command{SQE: nvme.PropertyCmd{Offset: off, Size8: size8}.SQE(0, false)})
	if err != nil {
		return 0, err
	}
	if !cqe.Status.OK() {
		return 0, &StatusError{Op: fmt.Sprintf("property get %#x", off), Status: cqe.Status}
	}
	if size8 {
		return cqe.Result, nil
	}
	return uint64(cqe.DW0()), nil
}

func (c *Controller) propSet(q transport.Queue, off uint32, v uint64) error {
	cqe, err := submit(q, transport.Command{SQE: nvme.PropertyCmd{Offset: off, Value: v}.SQE(0, true)})
	if err != nil {
		return err
	}
	if !cqe.Status.OK() {
		return &StatusError{Op: fmt.Sprintf("property set %#x", off), Status: cqe.Status}
	}
	return nil
}

func (c *Controller) adminRaw(q transport.Queue, sqe nvme.SQE, w, r []byte) (nvme.CQE, error) {
	return submit(q, transport.Command{SQE: sqe, Write: w, Read: r})
}

func (c *Controller) adminCmd(q transport.Queue, op string, sqe nvme.SQE, w, r []byte) error {
	cqe, err := c.adminRaw(q, sqe, w, r)
	if err != nil {
		return fmt.Errorf("%s on %s: %w", op, c.addr, err)
	}
	if !cqe.Status.OK() {
		return &StatusError{Op: op, Status: cqe.Status}
	}
	return nil
}

// Admin runs an admin command on the current association (waiting for a
// reconnect as I/O does). w is sent to the controller, r receives data.
func (c *Controller) Admin(ctx context.Context, sqe nvme.SQE, w, r []byte) (nvme.CQE, error) {
	if c.tr.MaxData() > 0 && (len(w) > adminMaxData || len(r) > adminMaxData) {
		// an admin queue of such a transport has buffers of adminMaxData
		return nvme.CQE{}, fmt.Errorf("admin command %#x on %s: %d bytes to send and %d to receive, at most %d each over %s: split the transfer (a log page by its offset)", sqe.Opcode, c.addr, len(w), len(r), adminMaxData, c.tr.Name())
	}
	a, err := c.current(ctx)
	if err != nil {
		return nvme.CQE{}, err
	}
	cqe, err := submit(a.admin, transport.Command{SQE: sqe, Write: w, Read: r})
	if err != nil {
		return cqe, fmt.Errorf("admin command %#x on %s: %w: %w", sqe.Opcode, c.addr, err, blockdev.ErrIO)
	}
	return cqe, nil
}

// GetLogPage reads len(buf) bytes (a multiple of 4) of log page lid.
func (c *Controller) GetLogPage(ctx context.Context, lid, lsp uint8, nsid uint32, off uint64, buf []byte) error {
	cqe, err := c.Admin(ctx, nvme.GetLogPageCmd{LID: lid, LSP: lsp, Len: uint32(len(buf)), Offset: off, NSID: nsid}.SQE(0), nil, buf)
	if err != nil {
		return err
	}
	if !cqe.Status.OK() {
		return &StatusError{Op: fmt.Sprintf("get log page %#x", lid), Status: cqe.Status}
	}
	return nil
}

// IdentifyNamespace returns the Identify Namespace data of nsid.
func (c *Controller) IdentifyNamespace(ctx context.Context, nsid uint32) (nvme.IdentifyNamespace, error) {
	buf := make([]byte, nvme.IdentifyLen)
	cqe, err := c.Admin(ctx, nvme.IdentifyCmd{CNS: nvme.CNSNamespace, NSID: nsid}.SQE(0), nil, buf)
	if err != nil {
		return nvme.IdentifyNamespace{}, err
	}
	if !cqe.Status.OK() {
		return nvme.IdentifyNamespace{}, &StatusError{Op: fmt.Sprintf("identify namespace %d", nsid), Status: cqe.Status}
	}
	return nvme.ParseIdentifyNamespace(buf)
}

// ActiveNamespaces lists the active namespace IDs.
func (c *Controller) ActiveNamespaces(ctx context.Context) ([]uint32, error) {
	buf := make([]byte, nvme.IdentifyLen)
	cqe, err := c.Admin(ctx, nvme.IdentifyCmd{CNS: nvme.CNSActiveNSList}.SQE(0), nil, buf)
	if err != nil {
		return nil, err
	}
	if !cqe.Status.OK() {
		return nil, &StatusError{Op: "identify active namespace list", Status: cqe.Status}
	}
	return nvme.ParseNSList(buf)
}
