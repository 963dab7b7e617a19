package target

import (
	"encoding/binary"
	"hash/fnv"
	"net"
	"os"
	"slices"
	"strings"

	"tier0/daemon/nvme"
)

// bootIDFile holds the kernel's boot id, new at every boot.
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// bootIncarnation is the node's boot incarnation that Identify Controller
// reports (nvme.IncarnationOff): a hash of Config.BootID or, by default,
// of the kernel's boot id. A restart of tier0d keeps it: the drives'
// completed writes are in the kernel's page cache or the drive's own
// cache, both of which outlive the process; a boot of the machine (a
// power cut) changes it, and a RAID owner then catches the member up
// (daemon/raid incarnation.go). 0 (none) when the boot id cannot be read.
func (t *Target) bootIncarnation() uint64 {
	id := t.cfg.BootID
	if id == "" {
		b, err := os.ReadFile(bootIDFile)
		if err != nil {
			t.log.Warn("the node's boot id cannot be read: Identify Controller reports no boot incarnation, so a RAID owner cannot tell this node's reboot from a reconnect",
				"file", bootIDFile, "err", err)
			return 0
		}
		id = strings.TrimSpace(string(b))
	}
	return incarnationOf(id)
}

// incarnationOf hashes a boot id (FNV-1a, 64 bits) to a non-zero
// incarnation.
func incarnationOf(bootID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(bootID))
	return max(h.Sum64(), 1)
}

func (t *Target) identifyController(c *controller) nvme.IdentifyController {
	ic := nvme.IdentifyController{
		SN: c.sub.serial, MN: c.sub.model, FR: firmwareRev, RAB: 6, CntlID: c.id, Ver: nvmeVersion, Incarnation: t.inc,
		MDTS: t.mdts, CTRATT: 1, // 128-bit host identifier
		KAS: 1, LPA: nvme.LPAExtendedLog | nvme.LPACmdEffects, AERL: maxAERs - 1, ACL: 3, SQES: 0x66, CQES: 0x44, MaxCmd: uint16(t.cfg.MaxQueueDepth),
		SGLS: 1 | 1<<20, SubNQN: c.sub.nqn, IORCSZ: 1, MSDBD: 1,
	}
	ic.SGLS |= c.admin.keyedSGLs() // NVMe/RDMA (rdma_conn.go)
	if c.sub.disc {
		ic.CntrlType = nvme.CtrlTypeDiscovery
		ic.OAES = nvme.OAESDiscoChanged
		ic.IOCCSZ = 4
		return ic
	}
	ic.CntrlType = nvme.CtrlTypeIO
	ic.CMIC = nvme.CMICMultiPort | nvme.CMICMultiCtrl | nvme.CMICANA
	ic.OAES = nvme.OAESANAChange | nvme.OAESNSAttr
	ic.ANATT = 10
	ic.ANACAP = nvme.ANACAPOptimized | nvme.ANACAPNonOptimized | nvme.ANACAPInaccessible | nvme.ANACAPPersistentLoss | nvme.ANACAPChange
	ic.ANAGRPMAX, ic.NANAGRPID = maxANAGroups, maxANAGroups
	ic.NN, ic.MNAN = maxNamespaces, maxNamespaces
	ic.ONCS = nvme.ONCSDSM | nvme.ONCSWriteZeroes | nvme.ONCSReservations | nvme.ONCSSaveSelect
	ic.VWC = 1
	ic.IOCCSZ = uint32((nvme.SQELen + t.cfg.InlineDataSize) / 16)
	ic.CQT = t.cqtMillis()
	return ic
}

func (t *Target) identify(r *request) nvme.Status {
	c := r.c.ctrl
	id := nvme.ParseIdentifyCmd(&r.sqe)
	switch id.CNS {
	case nvme.CNSController:
		ic := t.identifyController(c)
		r.sendData(ic.Append(nil))
	case nvme.CNSNamespace:
		if id.NSID == 0 || id.NSID == 0xFFFFFFFF {
			return nvme.StatusInvalidNS | nvme.StatusDNR
		}
		ns := c.namespace(id.NSID)
		if ns == nil {
			r.sendData(make([]byte, nvme.IdentifyLen))
			return nvme.StatusSuccess
		}
		in := ns.identify()
		r.sendData(in.Append(nil))
	case nvme.CNSActiveNSList, nvme.CNSCSActiveNSList:
		if id.CNS == nvme.CNSCSActiveNSList && id.CSI != nvme.CSINVM {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		if id.NSID >= 0xFFFFFFFE {
			return nvme.StatusInvalidNS | nvme.StatusDNR
		}
		r.sendData(nvme.AppendNSList(nil, c.nsids(), id.NSID))
	case nvme.CNSNSDescList:
		ns := c.namespace(id.NSID)
		if ns == nil {
			return nvme.StatusInvalidNS | nvme.StatusDNR
		}
		var d []nvme.NSDescriptor
		if ns.eui64 != ([8]byte{}) {
			d = append(d, nvme.NSDescriptor{Type: nvme.NIDTEUI64, ID: ns.eui64[:]})
		}
		if ns.nguid != ([16]byte{}) {
			d = append(d, nvme.NSDescriptor{Type: nvme.NIDTNGUID, ID: ns.nguid[:]})
		}
		if ns.uuid != ([16]byte{}) {
			d = append(d, nvme.NSDescriptor{Type: nvme.NIDTUUID, ID: ns.uuid[:]})
		}
		d = append(d, nvme.NSDescriptor{Type: nvme.NIDTCSI, ID: []byte{nvme.CSINVM}})
		r.sendData(nvme.AppendNSDescList(nil, d))
	case nvme.CNSCSController:
		if id.CSI != nvme.CSINVM {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		r.sendData(make([]byte, nvme.IdentifyLen)) // no extra NVM limits
	case nvme.CNSCSNamespace:
		if id.CSI != nvme.CSINVM {
			return nvme.StatusInvalidField | nvme.StatusDNR
		}
		if c.namespace(id.NSID) == nil {
			return nvme.StatusInvalidNS | nvme.StatusDNR
		}
		r.sendData(make([]byte, nvme.IdentifyLen))
	default:
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	return nvme.StatusSuccess
}

func (ns *namespace) identify() nvme.IdentifyNamespace {
	nb := uint64(ns.dev.Size() / int64(ns.bs))
	lbads := uint8(0)
	for b := ns.bs; b > 1; b >>= 1 {
		lbads++
	}
	rescap := nvme.RescapWriteExcl | nvme.RescapExclAccess | nvme.RescapWriteExclRO | nvme.RescapExclAccessRO |
		nvme.RescapWriteExclAR | nvme.RescapExclAccessAR | nvme.RescapIEKey
	if ns.sub.resvBackend.PTPL() != PTPLNone {
		rescap |= nvme.RescapPTPL
	}
	return nvme.IdentifyNamespace{
		NSZE: nb, NCAP: nb, NUSE: nb, NMIC: nvme.NMICShared,
		RESCAP: rescap,
		DLFEAT: nvme.DLFEATReadZeroes | nvme.DLFEATWZDeac, ANAGRPID: ns.group,
		NGUID: ns.nguid, EUI64: ns.eui64, LBAF: []nvme.LBAFormat{{LBADS: lbads}},
	}
}

func (t *Target) getLogPage(r *request) nvme.Status {
	c := r.c.ctrl
	g := nvme.ParseGetLogPageCmd(&r.sqe)
	switch g.LID {
	case nvme.LogSupportedPages:
		page := make([]byte, 1024)
		for _, lid := range []uint8{nvme.LogSupportedPages, nvme.LogError, nvme.LogSMART, nvme.LogFWSlot, nvme.LogChangedNSList, nvme.LogCmdEffects, nvme.LogANA, nvme.LogResvNotification} {
			page[4*int(lid)] = 1 // LSUPP
		}
		return r.sendLog(page, g)
	case nvme.LogError:
		return r.sendLog(make([]byte, nvme.ErrorLogEntryLen), g)
	case nvme.LogSMART:
		return r.sendLog(c.sub.smart(g.NSID), g)
	case nvme.LogFWSlot:
		page := make([]byte, 512)
		page[0] = 1
		copy(page[8:16], firmwareRev)
		return r.sendLog(page, g)
	case nvme.LogChangedNSList:
		c.mu.Lock()
		ids := c.changedNS
		if !g.RAE {
			c.changedNS = nil
		}
		c.mu.Unlock()
		page := make([]byte, 4096)
		for i, id := range ids {
			binary.LittleEndian.PutUint32(page[4*i:], id)
		}
		return r.sendLog(page, g)
	case nvme.LogCmdEffects:
		return r.sendLog(cmdEffects.Append(nil), g)
	case nvme.LogANA:
		l := c.anaLog()
		rgo := g.LSP&nvme.LogANALSPGroupsOnly != 0
		return r.sendLog(l.Append(nil, rgo), g)
	case nvme.LogResvNotification:
		return r.sendLog(c.readResvLog(g.RAE), g)
	}
	return nvme.StatusInvalidLogPage | nvme.StatusDNR
}

// cmdEffects lists the commands the target executes (the Commands
// Supported and Effects log): fabrics commands are not listed.
var cmdEffects = func() nvme.CmdEffectsLog {
	var l nvme.CmdEffectsLog
	for _, op := range []uint8{nvme.AdminGetLogPage, nvme.AdminIdentify, nvme.AdminAbort, nvme.AdminSetFeatures,
		nvme.AdminGetFeatures, nvme.AdminAsyncEvent, nvme.AdminKeepAlive} {
		l.Admin[op] = nvme.EffectCSUPP
	}
	for _, op := range []uint8{nvme.CmdFlush, nvme.CmdRead, nvme.CmdResvRegister, nvme.CmdResvReport, nvme.CmdResvAcquire, nvme.CmdResvRelease} {
		l.IO[op] = nvme.EffectCSUPP
	}
	for _, op := range []uint8{nvme.CmdWrite, nvme.CmdWriteZeroes, nvme.CmdDSM} {
		l.IO[op] = nvme.EffectCSUPP | nvme.EffectLBCC
	}
	return l
}()

func (s *subsystem) smart(nsid uint32) []byte {
	var l nvme.SMARTLog
	l.AvailSpare = 100
	s.mu.Lock()
	for id, ns := range s.ns {
		if nsid != 0 && nsid != 0xFFFFFFFF && nsid != id {
			continue
		}
		l.DataUnitsRead += (ns.readBytes.Load()/512 + 999) / 1000
		l.DataUnitsWritten += (ns.writtenBytes.Load()/512 + 999) / 1000
		l.HostReads += ns.reads.Load()
		l.HostWrites += ns.writes.Load()
	}
	s.mu.Unlock()
	return l.Append(nil)
}

// discoverySubsystem returns the target's discovery subsystem.
func (t *Target) discoverySubsystem() *subsystem {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.disc == nil {
		t.disc = &subsystem{t: t, nqn: nvme.DiscoveryNQN, serial: derivedSerial(nvme.DiscoveryNQN), model: "tier0", disc: true,
			hosts: map[string]bool{}, ns: map[uint32]*namespace{}, ana: map[uint32]*anaGroup{}, ctrls: map[uint16]*controller{},
			drains: map[hostKey]int{}, drained: make(chan struct{})}
	}
	return t.disc
}

func (t *Target) discoveryLog(c *controller) []byte {
	host, port := t.advertised()
	adrfam := nvme.AdrFamIPv4
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		adrfam = nvme.AdrFamIPv6
	}
	entry := func(nqn string, subtype uint8) nvme.DiscoveryEntry {
		return nvme.DiscoveryEntry{TrType: nvme.TrTypeTCP, AdrFam: adrfam, SubType: subtype, TReq: nvme.TReqNotSpecified,
			PortID: t.cfg.PortID, CntlID: nvme.CntlIDDynamic, ASQSZ: adminQueueDepth, TrSvcID: port, SubNQN: nqn, TrAddr: host, SecType: nvme.TCPSecTypeNone}
	}
	t.mu.Lock()
	l := nvme.DiscoveryLog{GenCtr: t.discGen}
	subs := make([]*subsystem, 0, len(t.subsys))
	for _, s := range t.subsys {
		subs = append(subs, s)
	}
	t.mu.Unlock()
	slices.SortFunc(subs, func(a, b *subsystem) int {
		if a.nqn < b.nqn {
			return -1
		}
		return 1
	})
	l.Entries = append(l.Entries, entry(nvme.DiscoveryNQN, nvme.SubTypeCurDisc))
	for _, s := range subs {
		if s.allowed(c.hostNQN) {
			l.Entries = append(l.Entries, entry(s.nqn, nvme.SubTypeNVMe))
		}
	}
	return c.admin.transportLog(l.Append(nil)) // an RDMA port's entries (rdma_conn.go)
}
