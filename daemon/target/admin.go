package target

import (
	"slices"
	"time"

	"tier0/daemon/nvme"
)

// statusParked marks an Asynchronous Event Request that stays outstanding.
const statusParked nvme.Status = 0xFFFF

const (
	nvmeVersion = 0x00010400 // NVMe 1.4: ANA, reservations as Linux expects
	firmwareRev = "1.0"
)

// sendData makes b the data returned to the host with the response,
// truncated to the length the host's SGL describes.
func (r *request) sendData(b []byte) {
	if r.buf != nil {
		r.c.t.pools.put(r.buf)
	}
	r.buf = &buffer{b: b}
	r.data = b
	n := len(b)
	if l := int(r.sqe.DPTR.Length); l < n {
		n = l
	}
	r.sendLen = n
}

// execute runs one command and sends its response.
func (t *Target) execute(r *request) {
	c := r.c
	s := &r.sqe
	var st nvme.Status
	switch {
	case s.Opcode == nvme.AdminFabrics:
		st = t.fabrics(r)
	case !c.ctrl.enabled():
		st = nvme.StatusCmdSeqError | nvme.StatusDNR
	case c.qid == 0 && c.ctrl.sub.disc:
		st = t.discoveryAdmin(r)
	case c.qid == 0:
		st = t.admin(r)
	default:
		st = t.io(r)
	}
	if st == statusParked {
		return
	}
	c.complete(r, st)
}

func (c *controller) enabled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cc&nvme.CCEnable != 0 && c.csts&nvme.CSTSReady != 0
}

func (t *Target) fabrics(r *request) nvme.Status {
	c := r.c
	s := &r.sqe
	switch s.FCType() {
	case nvme.FabricsConnect:
		if c.ctrl != nil {
			return nvme.StatusCmdSeqError | nvme.StatusDNR
		}
		return t.connect(r)
	case nvme.FabricsPropertyGet, nvme.FabricsPropertySet:
		if c.qid != 0 {
			return nvme.StatusInvalidOpcode | nvme.StatusDNR
		}
		return c.ctrl.property(r)
	case nvme.FabricsDisconnect:
		r.closeConn = true
		return nvme.StatusSuccess
	case nvme.FabricsAuthSend:
		return t.authSend(r)
	case nvme.FabricsAuthRecv:
		return t.authRecv(r)
	}
	return nvme.StatusInvalidOpcode | nvme.StatusDNR
}

// connectError sets the Connect response's IPO/IATTR.
func connectError(r *request, st nvme.Status, inData bool, offset uint16) nvme.Status {
	r.cqe.Result = uint64(offset)
	if inData {
		r.cqe.Result |= 1 << 16
	}
	return st | nvme.StatusDNR
}

func (t *Target) connect(r *request) nvme.Status {
	c := r.c
	cmd := nvme.ParseConnectCmd(&r.sqe)
	if cmd.RecFmt != 0 {
		return nvme.StatusConnectFormat | nvme.StatusDNR
	}
	if len(r.data) < nvme.ConnectDataLen {
		return nvme.StatusSGLInvalidData | nvme.StatusDNR
	}
	d, err := nvme.ParseConnectData(r.data)
	if err != nil {
		return connectError(r, nvme.StatusConnectInvalidParam, true, 256)
	}
	var sub *subsystem
	if d.SubNQN == nvme.DiscoveryNQN {
		sub = t.discoverySubsystem()
	} else {
		t.mu.Lock()
		sub = t.subsys[d.SubNQN]
		t.mu.Unlock()
	}
	if sub == nil {
		t.warnLimited("connect-nosub:"+d.SubNQN, "connect to a subsystem not served here", "subnqn", d.SubNQN, "hostnqn", d.HostNQN, "remote", c.remote())
		return connectError(r, nvme.StatusConnectInvalidParam, true, 256)
	}
	if !sub.allowed(d.HostNQN) {
		t.warnLimited("connect-host:"+d.HostNQN, "host not on the subsystem's allow-list", "subnqn", d.SubNQN, "hostnqn", d.HostNQN, "remote", c.remote())
		return connectError(r, nvme.StatusConnectInvalidHost, true, 512)
	}
	maxDepth := t.cfg.MaxQueueDepth
	if cmd.QID == 0 {
		maxDepth = max(adminQueueDepth, maxDepth)
	}
	if cmd.SQSize < 1 || int(cmd.SQSize) >= maxDepth {
		return connectError(r, nvme.StatusConnectInvalidParam, false, 44)
	}
	depth := int(cmd.SQSize) + 1
	if cmd.QID == 0 {
		if d.CntlID != nvme.CntlIDDynamic {
			return connectError(r, nvme.StatusConnectInvalidParam, true, 16)
		}
		ctrl := &controller{t: t, sub: sub, hostNQN: d.HostNQN, hostID: d.HostID, ioq: map[uint16]*conn{}, admin: c, numIOQ: t.cfg.MaxIOQueues}
		if sub.disc {
			ctrl.numIOQ = 0
		}
		ctrl.kato.Store(cmd.KATO)
		ctrl.touch()
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nvme.StatusConnectCtrlBusy | nvme.StatusDNR
		}
		id, ok := t.allocCntlID()
		if !ok {
			t.mu.Unlock()
			t.warnLimited("cntlid", "no free controller ID", "range_base", t.cfg.CntlIDBase, "range_count", t.cfg.CntlIDCount)
			return nvme.StatusConnectCtrlBusy | nvme.StatusDNR
		}
		ctrl.id = id
		t.ctrls[id] = ctrl
		t.mu.Unlock()
		sub.mu.Lock()
		sub.ctrls[id] = ctrl
		sub.mu.Unlock()
		c.ctrl, c.qid = ctrl, 0
		c.setDepthKeep(depth, r)
		_ = c.nc.SetReadDeadline(time.Time{})
		r.cqe.Result = uint64(id)
		t.requireAuth(c, sub, d.HostNQN, r)
		t.log.Info("controller created", "cntlid", id, "subnqn", sub.nqn, "hostnqn", d.HostNQN, "kato_ms", cmd.KATO, "remote", c.remote())
		return nvme.StatusSuccess
	}
	t.mu.Lock()
	ctrl := t.ctrls[d.CntlID]
	t.mu.Unlock()
	if ctrl == nil || ctrl.sub != sub || ctrl.hostNQN != d.HostNQN || ctrl.hostID != d.HostID {
		return connectError(r, nvme.StatusConnectInvalidParam, true, 16)
	}
	// The command lifetime rule (docs/FABRIC.md): while a dead I/O queue
	// of this host still has commands executing, the host — which may be
	// resubmitting them — gets no new I/O queue. The connect waits up to
	// CommandQuiesceTime for them, then fails with controller busy without
	// DNR: the host retries the connect (tier0's host and Linux both do).
	if n := sub.awaitDrained(hostKey{d.HostNQN, d.HostID}, t.cfg.CommandQuiesceTime, c.done); n > 0 {
		t.warnLimited("connect-drain:"+d.HostNQN, "I/O queue connect refused until the host's closed queues have finished their commands; the host retries",
			"subnqn", sub.nqn, "hostnqn", d.HostNQN, "cntlid", d.CntlID, "qid", cmd.QID, "draining_queues", n)
		return nvme.StatusConnectCtrlBusy
	}
	ctrl.mu.Lock()
	if ctrl.dead || int(cmd.QID) > ctrl.numIOQ || (ctrl.ioq[cmd.QID] != nil && !ctrl.ioq[cmd.QID].closing()) {
		ctrl.mu.Unlock()
		return connectError(r, nvme.StatusConnectInvalidParam, false, 42)
	}
	ctrl.ioq[cmd.QID] = c
	ctrl.mu.Unlock()
	c.ctrl, c.qid = ctrl, cmd.QID
	c.setDepthKeep(depth, r)
	c.startWorkers(min(t.cfg.WorkersPerQueue, depth))
	_ = c.nc.SetReadDeadline(time.Time{})
	r.cqe.Result = uint64(ctrl.id)
	t.requireAuth(c, sub, d.HostNQN, r)
	return nvme.StatusSuccess
}

// setDepthKeep resizes the slot table to n entries, keeping r (the Connect
// command, still in flight) in its slot.
func (c *conn) setDepthKeep(n int, r *request) {
	c.smu.Lock()
	defer c.smu.Unlock()
	if n < 2 {
		n = 2
	}
	c.depth = n
	c.slots = make([]*request, n)
	c.free = c.free[:0]
	for i := n - 1; i >= 0; i-- {
		if i == 0 {
			continue
		}
		c.free = append(c.free, uint16(i))
	}
	r.slot = 0
	c.slots[0] = r
	c.sqhd %= uint32(n)
}

func (c *controller) property(r *request) nvme.Status {
	p := nvme.ParsePropertyCmd(&r.sqe)
	set := r.sqe.FCType() == nvme.FabricsPropertySet
	c.mu.Lock()
	defer c.mu.Unlock()
	if set {
		if p.Offset != nvme.PropCC {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		v := uint32(p.Value)
		old := c.cc
		if v&nvme.CCEnable != 0 && old&nvme.CCEnable == 0 {
			if nvme.CCIOSQES(v) != 6 || nvme.CCIOCQES(v) != 4 {
				c.csts |= nvme.CSTSFatal
			} else {
				c.csts |= nvme.CSTSReady
			}
		}
		if v&nvme.CCEnable == 0 && old&nvme.CCEnable != 0 {
			c.csts &^= nvme.CSTSReady
		}
		if v&nvme.CCShutdownMask != 0 && old&nvme.CCShutdownMask == 0 {
			c.csts &^= nvme.CSTSReady
			c.csts |= nvme.CSTSShutdownDone
		}
		if v&nvme.CCShutdownMask == 0 {
			c.csts &^= nvme.CSTSShutdownDone
		}
		c.cc = v
		return nvme.StatusSuccess
	}
	switch p.Offset {
	case nvme.PropCAP:
		mqes := uint64(c.t.cfg.MaxQueueDepth - 1)
		r.cqe.Result = mqes | 15<<24 | 1<<37
	case nvme.PropVS:
		r.cqe.Result = nvmeVersion
	case nvme.PropCC:
		r.cqe.Result = uint64(c.cc)
	case nvme.PropCSTS:
		r.cqe.Result = uint64(c.csts)
	case nvme.PropINTMS, nvme.PropINTMC, nvme.PropNSSR, nvme.PropAQA, nvme.PropASQ, nvme.PropACQ:
		r.cqe.Result = 0
	default:
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	return nvme.StatusSuccess
}

func (t *Target) admin(r *request) nvme.Status {
	c := r.c.ctrl
	s := &r.sqe
	switch s.Opcode {
	case nvme.AdminIdentify:
		return t.identify(r)
	case nvme.AdminGetLogPage:
		return t.getLogPage(r)
	case nvme.AdminSetFeatures, nvme.AdminGetFeatures:
		return c.features(r)
	case nvme.AdminAsyncEvent:
		return c.asyncEvent(r)
	case nvme.AdminKeepAlive:
		return nvme.StatusSuccess
	case nvme.AdminAbort:
		r.cqe.Result = 1 // not aborted
		return nvme.StatusSuccess
	}
	return nvme.StatusInvalidOpcode | nvme.StatusDNR
}

func (t *Target) discoveryAdmin(r *request) nvme.Status {
	c := r.c.ctrl
	s := &r.sqe
	switch s.Opcode {
	case nvme.AdminIdentify:
		id := nvme.ParseIdentifyCmd(s)
		if id.CNS != nvme.CNSController {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		ic := t.identifyController(c)
		r.sendData(ic.Append(nil))
		return nvme.StatusSuccess
	case nvme.AdminGetLogPage:
		g := nvme.ParseGetLogPageCmd(s)
		switch g.LID {
		case nvme.LogDiscovery:
			return r.sendLog(t.discoveryLog(c), g)
		case nvme.LogError:
			return r.sendLog(make([]byte, nvme.ErrorLogEntryLen), g)
		}
		return nvme.StatusInvalidLogPage | nvme.StatusDNR
	case nvme.AdminSetFeatures, nvme.AdminGetFeatures:
		return c.features(r)
	case nvme.AdminAsyncEvent:
		return c.asyncEvent(r)
	case nvme.AdminKeepAlive:
		return nvme.StatusSuccess
	}
	return nvme.StatusInvalidOpcode | nvme.StatusDNR
}

// sendLog returns the part of page the Get Log Page command asks for.
// Bytes past the end of the page read as zeroes, also when the offset
// itself is past the end: libnvme (nvme-cli 2.3) reads the ANA log in
// 4 KiB pieces up to the size the Identify maxima allow, far more than a
// page with one group holds, and Linux nvmet answers every piece.
func (r *request) sendLog(page []byte, g nvme.GetLogPageCmd) nvme.Status {
	if g.Offset%4 != 0 {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	if int64(g.Len) > int64(r.c.t.cfg.MaxDataTransfer) {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	out := make([]byte, g.Len)
	if g.Offset < uint64(len(page)) {
		copy(out, page[g.Offset:])
	}
	r.sendData(out)
	return nvme.StatusSuccess
}

func (c *controller) asyncEvent(r *request) nvme.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.aers) >= maxAERs {
		return nvme.StatusAsyncLimit | nvme.StatusDNR
	}
	c.aers = append(c.aers, r.sqe.CID)
	r.c.freeSlot(r)
	r.c.t.pools.put(r.buf)
	*r = request{}
	reqPool.Put(r)
	c.deliverLocked()
	return statusParked
}

// featureInfo is what Get Features with Select default (1), saved (2) or
// supported capabilities (3) returns for a feature: nothing is saveable,
// so the saved value is the default.
type featureInfo struct {
	def  uint32
	caps uint32
}

func (c *controller) featureInfo(fid uint8) (featureInfo, bool) {
	switch fid {
	case nvme.FeatArbitration, nvme.FeatPowerMgmt, nvme.FeatTempThreshold, nvme.FeatErrorRecovery,
		nvme.FeatIRQCoalesce, nvme.FeatWriteAtomicity, nvme.FeatVolatileWC:
		if c.sub.disc {
			return featureInfo{}, false
		}
		if fid == nvme.FeatVolatileWC {
			return featureInfo{def: 1}, true
		}
		return featureInfo{}, true
	case nvme.FeatNumQueues:
		if c.sub.disc {
			return featureInfo{}, false
		}
		n := uint32(c.t.cfg.MaxIOQueues - 1)
		return featureInfo{def: n | n<<16, caps: nvme.FeatCapChangeable}, true
	case nvme.FeatKeepAlive, nvme.FeatAsyncEventCfg:
		return featureInfo{caps: nvme.FeatCapChangeable}, true
	case nvme.FeatHostID:
		return featureInfo{}, !c.sub.disc
	case nvme.FeatResvNotifMask:
		return featureInfo{caps: nvme.FeatCapChangeable | nvme.FeatCapNSSpecific}, !c.sub.disc
	case nvme.FeatResvPersistence:
		if c.sub.disc {
			return featureInfo{}, false
		}
		m := c.sub.resvBackend.PTPL()
		fi := featureInfo{caps: nvme.FeatCapNSSpecific}
		if m == PTPLChangeable {
			fi.caps |= nvme.FeatCapChangeable
		}
		if m != PTPLNone {
			fi.def = 1
		}
		return fi, true
	case nvme.FeatNSWriteProtect:
		return featureInfo{caps: nvme.FeatCapNSSpecific}, !c.sub.disc
	}
	return featureInfo{}, false
}

// featureNamespace checks the NSID of a namespace-specific feature: a
// namespace of the subsystem, or 0 / all namespaces (nil).
func (c *controller) featureNamespace(nsid uint32) (*namespace, nvme.Status) {
	if nsid == 0 || nsid == 0xFFFFFFFF {
		return nil, nvme.StatusSuccess
	}
	ns := c.namespace(nsid)
	if ns == nil {
		return nil, nvme.StatusInvalidNS | nvme.StatusDNR
	}
	return ns, nvme.StatusSuccess
}

func (c *controller) features(r *request) nvme.Status {
	s := &r.sqe
	fid := uint8(s.CDW10)
	set := s.Opcode == nvme.AdminSetFeatures
	info, known := c.featureInfo(fid)
	if !known {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	if set && s.CDW10&(1<<31) != 0 {
		return nvme.StatusFeatureNotSaveable | nvme.StatusDNR
	}
	if !set {
		switch sel := uint8(s.CDW10>>8) & 7; sel {
		case nvme.FeatSelCurrent:
		case nvme.FeatSelDefault, nvme.FeatSelSaved:
			if fid == nvme.FeatHostID {
				break // fixed at Connect: the current value is the only one
			}
			r.cqe.Result = uint64(info.def)
			return nvme.StatusSuccess
		case nvme.FeatSelSupported:
			r.cqe.Result = uint64(info.caps)
			return nvme.StatusSuccess
		default:
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
	}
	switch fid {
	case nvme.FeatResvPersistence, nvme.FeatNSWriteProtect:
		// namespace specific; handled without c.mu (the reservation
		// takes its gate, and applying a reservation change takes c.mu)
		ns, st := c.featureNamespace(s.NSID)
		if !st.OK() {
			return st
		}
		if fid == nvme.FeatNSWriteProtect {
			if set && s.CDW11&7 != 0 {
				return nvme.StatusFeatureNotChangable | nvme.StatusDNR
			}
			r.cqe.Result = 0 // no write protection
			return nvme.StatusSuccess
		}
		if ns == nil {
			if set {
				return nvme.StatusInvalidNS | nvme.StatusDNR // one namespace at a time
			}
			r.cqe.Result = uint64(info.def)
			return nvme.StatusSuccess
		}
		if set {
			return ns.resv.setPTPL(c.t, c, s.CDW11&1 != 0)
		}
		if ns.resv.ptpl() {
			r.cqe.Result = 1
		}
		return nvme.StatusSuccess
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch fid {
	case nvme.FeatNumQueues:
		if set {
			nsq, ncq := s.CDW11&0xFFFF, s.CDW11>>16
			if nsq == 0xFFFF || ncq == 0xFFFF {
				return nvme.StatusInvalidField | nvme.StatusDNR
			}
			if len(c.ioq) == 0 {
				c.numIOQ = min(int(min(nsq, ncq))+1, c.t.cfg.MaxIOQueues)
			}
		}
		n := uint64(c.numIOQ - 1)
		r.cqe.Result = n | n<<16
	case nvme.FeatKeepAlive:
		if set {
			c.kato.Store(s.CDW11)
		}
		r.cqe.Result = uint64(c.kato.Load())
	case nvme.FeatAsyncEventCfg:
		supported := nvme.OAESANAChange | nvme.OAESNSAttr
		if c.sub.disc {
			supported = nvme.OAESDiscoChanged
		}
		if set {
			c.aec = s.CDW11 & supported
			c.deliverLocked()
		}
		r.cqe.Result = uint64(c.aec)
	case nvme.FeatVolatileWC:
		if set {
			if s.CDW11&1 == 0 {
				return nvme.StatusFeatureNotChangable | nvme.StatusDNR
			}
		}
		r.cqe.Result = 1
	case nvme.FeatArbitration, nvme.FeatPowerMgmt, nvme.FeatErrorRecovery, nvme.FeatIRQCoalesce, nvme.FeatWriteAtomicity, nvme.FeatTempThreshold:
		if set {
			return nvme.StatusFeatureNotChangable | nvme.StatusDNR
		}
		r.cqe.Result = 0
	case nvme.FeatHostID:
		if set {
			return nvme.StatusCmdSeqError | nvme.StatusDNR // fixed at Connect on fabrics
		}
		if s.CDW11&1 == 0 {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		r.sendData(slices.Clone(c.hostID[:]))
	case nvme.FeatResvNotifMask:
		if set {
			c.resvMask = s.CDW11 & 0xE
		}
		r.cqe.Result = uint64(c.resvMask)
	default:
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	return nvme.StatusSuccess
}
