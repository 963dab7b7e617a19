package perf

// BenchmarkTargetCPU: the CPU time tier0's NVMe/TCP target spends per I/O,
// against a baseline that does not share Go's per-request overheads: a
// minimal NVMe/TCP responder in raw, blocking system calls on one thread
// ("bare": one read of everything the socket holds, every complete PDU
// parsed from it, one writev of all the answers, read data sent from the
// memory device itself, read(2)/writev(2) as raw system calls that the Go
// runtime does not see), moving the same PDUs and bytes in the same run.
//
// Each server runs in its own child process (this test binary re-executed,
// GOMAXPROCS=1 as in the one-core comparison with SPDK of issue 15), driven
// by the same pipelined raw client in this process, which sends every PDU
// in its own write as spdk_nvme_perf and the Linux host do; the server's
// CPU time (getrusage in the child: user+system, all threads) and
// read/write system calls (syscr, syscw of /proc/PID/io; epoll and futex
// calls are not counted) are divided by the I/Os done. CPU time per I/O
// depends much less on what else the machine runs than the I/O rates do.
//
// Metrics: target-cpu-us/io, bare-cpu-us/io, cpu-ratio (bare / target: 1.0
// means the target costs no more than the floor), the same per MiB, and
// read+write system calls per I/O of each.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"tier0/daemon/blockdev/local"
	"tier0/daemon/nvme"
	"tier0/daemon/target"
)

const (
	wireNQN     = "nqn.2026-12.io.tier0.bench:wire"
	wireHostNQN = "nqn.2026-12.io.tier0.bench:host"
	wireDevSize = 64 << 20
	wireInline  = 16 << 10 // in-capsule data limit of both servers
)

func TestMain(m *testing.M) {
	switch os.Getenv("TIER0_PERF_CHILD") {
	case "target":
		os.Exit(childTarget())
	case "bare":
		os.Exit(childBare())
	}
	os.Exit(m.Run())
}

// childTarget serves a memory namespace with tier0's target, prints its
// address and serves until stdin closes.
func childTarget() int {
	tg, err := target.New(target.Config{Listen: "127.0.0.1:0", InlineDataSize: wireInline})
	if err == nil {
		err = tg.Start()
	}
	var mem *local.Memory
	if err == nil {
		mem, err = local.NewMemory(wireDevSize, 4096)
	}
	if err == nil {
		err = tg.AddSubsystem(target.SubsystemConfig{NQN: wireNQN, AllowAnyHost: true})
	}
	if err == nil {
		err = tg.AddNamespace(wireNQN, target.NamespaceConfig{NSID: 1, Device: mem})
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	// touch every page now, so that no run pays for the first faults
	buf := make([]byte, 1<<20)
	for off := int64(0); off < wireDevSize; off += int64(len(buf)) {
		mem.WriteAt(buf, off)
	}
	fmt.Println(tg.Addr().String())
	answerUsage()
	tg.Close()
	return 0
}

// answerUsage answers each line on stdin with this process's CPU time in
// nanoseconds (getrusage: user+system, all threads) and its read and write
// system calls (syscr, syscw of /proc/self/io), until stdin closes.
func answerUsage() {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var ru unix.Rusage
		unix.Getrusage(unix.RUSAGE_SELF, &ru)
		var r, w int64
		if iob, err := os.ReadFile("/proc/self/io"); err == nil {
			for _, l := range strings.Split(string(iob), "\n") {
				k, v, _ := strings.Cut(l, ": ")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "syscr":
					r = n
				case "syscw":
					w = n
				}
			}
		}
		fmt.Println(ru.Utime.Nano()+ru.Stime.Nano(), r, w)
	}
}

// childBare is the baseline server: one thread, blocking system calls.
func childBare() int {
	runtime.LockOSThread()
	fail := func(err error) int { fmt.Println("error", err); return 1 }
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fail(err)
	}
	if err := unix.Listen(lfd, 1); err != nil {
		return fail(err)
	}
	sa, err := unix.Getsockname(lfd)
	if err != nil {
		return fail(err)
	}
	fmt.Printf("127.0.0.1:%d\n", sa.(*unix.SockaddrInet4).Port)
	go func() { answerUsage(); os.Exit(0) }()
	for {
		fd, _, err := unix.Accept(lfd)
		if err != nil {
			return fail(err)
		}
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		bareServe(fd)
		unix.Close(fd)
	}
}

// bareServe answers NVMe/TCP PDUs on fd until it closes: ICReq, reads
// (C2HData from the memory itself, then a CapsuleResp), writes with data
// in the capsule (copied into memory, CapsuleResp) or without (R2T, then
// the H2CData copied into memory, CapsuleResp).
func bareServe(fd int) {
	mem := make([]byte, wireDevSize)
	for i := range mem {
		mem[i] = byte(i) // touch every page now
	}
	in := make([]byte, 4<<20)
	have := 0
	hdrs := make([]byte, 0, 64<<10) // headers of the answers of one wake-up
	type piece struct{ hdr, data int }
	var (
		iov    [][]byte
		vec    []unix.Iovec
		pieces []piece // offsets into hdrs; data < 0: none
		datas  [][]byte
	)
	for {
		n, err := rawRead(fd, in[have:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		have += n
		hdrs, pieces, datas = hdrs[:0], pieces[:0], datas[:0]
		pos := 0
		for have-pos >= nvme.CommonHeaderLen {
			b := in[pos:have]
			plen := int(binary.LittleEndian.Uint32(b[4:]))
			if have-pos < plen {
				break
			}
			start := len(hdrs)
			switch nvme.PDUType(b[0]) {
			case nvme.PDUICReq:
				hdrs = nvme.ICResp{MaxData: 1 << 20}.Append(hdrs)
				pieces = append(pieces, piece{start, -1})
			case nvme.PDUCapsuleCmd:
				cid := binary.LittleEndian.Uint16(b[10:])
				slba := uint64(binary.LittleEndian.Uint32(b[48:])) | uint64(binary.LittleEndian.Uint32(b[52:]))<<32
				nlb := int(binary.LittleEndian.Uint32(b[56:])&0xFFFF) + 1
				off := int(slba*4096) % wireDevSize
				size := nlb * 4096
				if off+size > wireDevSize {
					off = 0
				}
				switch b[8] {
				case nvme.CmdRead:
					hdrs = nvme.DataPDU{Type: nvme.PDUC2HData, Flags: nvme.FlagDataLast, CID: cid, Length: uint32(size)}.Append(hdrs, 0)
					pieces = append(pieces, piece{start, len(datas)})
					datas = append(datas, mem[off:off+size])
					start = len(hdrs)
					hdrs = nvme.AppendCapsuleResp(hdrs, &nvme.CQE{CID: cid, SQID: 1}, 0)
					pieces = append(pieces, piece{start, -1})
				case nvme.CmdWrite:
					if plen > nvme.CapsuleCmdHLen {
						copy(mem[off:off+size], b[nvme.CapsuleCmdHLen:plen])
						hdrs = nvme.AppendCapsuleResp(hdrs, &nvme.CQE{CID: cid, SQID: 1}, 0)
					} else {
						hdrs = nvme.R2T{CID: cid, TTag: uint16(off / 4096), Length: uint32(size)}.Append(hdrs, 0)
					}
					pieces = append(pieces, piece{start, -1})
				default: // admin commands are not needed by the client
					hdrs = nvme.AppendCapsuleResp(hdrs, &nvme.CQE{CID: cid}, 0)
					pieces = append(pieces, piece{start, -1})
				}
			case nvme.PDUH2CData:
				cid := binary.LittleEndian.Uint16(b[8:])
				off := int(binary.LittleEndian.Uint16(b[10:])) * 4096
				doff := int(binary.LittleEndian.Uint32(b[12:]))
				dl := int(binary.LittleEndian.Uint32(b[16:]))
				if off+doff+dl <= wireDevSize {
					copy(mem[off+doff:], b[nvme.DataHLen:nvme.DataHLen+dl])
				}
				if b[1]&nvme.FlagDataLast != 0 {
					hdrs = nvme.AppendCapsuleResp(hdrs, &nvme.CQE{CID: cid, SQID: 1}, 0)
					pieces = append(pieces, piece{start, -1})
				}
			default:
				return
			}
			pos += plen
		}
		have = copy(in, in[pos:have])
		if len(pieces) == 0 {
			continue
		}
		iov = iov[:0]
		for i, p := range pieces {
			end := len(hdrs)
			if i+1 < len(pieces) {
				end = pieces[i+1].hdr
			}
			iov = append(iov, hdrs[p.hdr:end])
			if p.data >= 0 {
				iov = append(iov, datas[p.data])
			}
		}
		if vec, err = writevAll(fd, iov, vec); err != nil {
			return
		}
	}
}

// rawRead and rawWritev are read(2) and writev(2) without the Go
// runtime's system call bookkeeping (RawSyscall: no entersyscall, no P
// hand-off, no spinning thread looking for work while this one blocks),
// so the baseline pays only the kernel. The bare child runs with GC off
// and a spare P for the goroutine that answers usage queries.
func rawRead(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawWritev(fd int, iov []unix.Iovec) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// writevAll writes every byte of iov with as few writev calls as the
// socket allows.
func writevAll(fd int, iov [][]byte, vec []unix.Iovec) ([]unix.Iovec, error) {
	for len(iov) > 0 {
		vec = vec[:0]
		for _, b := range iov[:min(len(iov), 1024)] {
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			vec = append(vec, v)
		}
		n, err := rawWritev(fd, vec)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return vec, err
		}
		for n > 0 {
			if n >= len(iov[0]) {
				n -= len(iov[0])
				iov = iov[1:]
			} else {
				iov[0] = iov[0][n:]
				n = 0
			}
		}
		for len(iov) > 0 && len(iov[0]) == 0 {
			iov = iov[1:]
		}
	}
	return vec, nil
}

// child is a server in a child process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	addr  string
}

func startChild(b *testing.B, kind string) *child {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TIER0_PERF_CHILD="+kind, "GOMAXPROCS=1")
	if kind == "bare" {
		// the serving thread blocks in raw system calls holding its P:
		// a second P answers usage queries, and no GC may need to stop it
		cmd.Env = append(os.Environ(), "TIER0_PERF_CHILD=bare", "GOMAXPROCS=2", "GOGC=off", "GODEBUG=asyncpreemptoff=1")
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, out: bufio.NewReader(out)}
	b.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := c.out.ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error") {
		b.Fatalf("%s server: %q %v", kind, line, err)
	}
	c.addr = strings.TrimSpace(line)
	return c
}

// usage is a child's CPU time and read/write system calls so far.
type usage struct {
	cpu          time.Duration
	reads, write int64
}

func (c *child) usage(b *testing.B) usage {
	if _, err := io.WriteString(c.stdin, "u\n"); err != nil {
		b.Fatal(err)
	}
	line, err := c.out.ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	var u usage
	var ns int64
	if _, err := fmt.Sscan(line, &ns, &u.reads, &u.write); err != nil {
		b.Fatalf("usage %q: %v", line, err)
	}
	u.cpu = time.Duration(ns)
	return u
}

// wireClient is a pipelined NVMe/TCP client for one I/O queue.
type wireClient struct {
	nc   net.Conn
	br   *bufio.Reader
	cid  uint16
	data []byte
}

func dialWire(b *testing.B, addr string, size int) *wireClient {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	c := &wireClient{nc: nc, br: bufio.NewReaderSize(nc, 1<<20), data: make([]byte, size)}
	if _, err := nc.Write(nvme.ICReq{}.Append(nil)); err != nil {
		b.Fatal(err)
	}
	resp := make([]byte, nvme.ICRespLen)
	if _, err := io.ReadFull(c.br, resp); err != nil {
		b.Fatal(err)
	}
	return c
}

// sync sends one admin/fabrics command (data in the capsule) and waits
// for its CapsuleResp.
func (c *wireClient) sync(b *testing.B, sqe nvme.SQE, data []byte) nvme.CQE {
	c.cid++
	sqe.CID, sqe.Flags = c.cid, sqe.Flags|nvme.SQEFlagSGLMeta
	sqe.DPTR = nvme.SGL{Type: nvme.SGLTypeTransport}
	if len(data) > 0 {
		sqe.DPTR = nvme.SGL{Length: uint32(len(data)), Type: nvme.SGLTypeInCapsule}
	}
	p := append(nvme.AppendCapsuleCmd(nil, &sqe, len(data), 0), data...)
	if _, err := c.nc.Write(p); err != nil {
		b.Fatal(err)
	}
	h := make([]byte, nvme.CapsuleRespHLen)
	if _, err := io.ReadFull(c.br, h); err != nil {
		b.Fatal(err)
	}
	cqe, err := nvme.ParseCapsuleResp(h)
	if err != nil || !cqe.Status.OK() {
		b.Fatalf("opcode %#x: %v %v", sqe.Opcode, cqe.Status, err)
	}
	return cqe
}

// connectTarget opens and enables an admin queue and returns a connected
// I/O queue.
func connectTarget(b *testing.B, addr string, size int) *wireClient {
	hostID := [16]byte{1, 2, 3}
	a := dialWire(b, addr, 0)
	d := nvme.ConnectData{HostID: hostID, CntlID: nvme.CntlIDDynamic, SubNQN: wireNQN, HostNQN: wireHostNQN}
	cqe := a.sync(b, nvme.ConnectCmd{QID: 0, SQSize: 31}.SQE(0), d.Append(nil))
	a.sync(b, nvme.PropertyCmd{Offset: nvme.PropCC, Value: 1 | 6<<16 | 4<<20}.SQE(0, true), nil)
	q := dialWire(b, addr, size)
	d.CntlID = uint16(cqe.DW0())
	q.sync(b, nvme.ConnectCmd{QID: 1, SQSize: 127}.SQE(0), d.Append(nil))
	return q
}

// run keeps depth I/Os of size bytes in flight until n complete.
func (c *wireClient) run(b *testing.B, n, depth int, write bool, size int) {
	_ = c.nc.SetDeadline(time.Now().Add(10 * time.Minute))
	issued, done := 0, 0
	var out net.Buffers
	hdrs := make([]byte, 0, 64<<10)
	flush := func() {
		if len(out) > 0 {
			if _, err := out.WriteTo(c.nc); err != nil {
				b.Fatal(err)
			}
		}
		out, hdrs = out[:0], hdrs[:0]
	}
	// Each PDU goes out in its own write, as spdk_nvme_perf and the Linux
	// host send them, so the servers see commands arrive one by one.
	queue := func() {
		s := nvme.SQE{Opcode: nvme.CmdRead, NSID: 1, CID: uint16(issued % 1024), Flags: nvme.SQEFlagSGLMeta}
		slots := uint64(wireDevSize / size)
		slot := uint64(issued) * 2654435761 % slots // scattered over the device
		s.SetRW(slot*uint64(size/4096), uint32(size/4096))
		s.DPTR = nvme.SGL{Length: uint32(size), Type: nvme.SGLTypeTransport}
		inline := 0
		if write {
			s.Opcode = nvme.CmdWrite
			if size <= wireInline {
				s.DPTR.Type, inline = nvme.SGLTypeInCapsule, size
			}
		}
		start := len(hdrs)
		hdrs = nvme.AppendCapsuleCmd(hdrs, &s, inline, 0)
		out = append(out, hdrs[start:])
		if inline > 0 {
			out = append(out, c.data)
		}
		issued++
		flush()
	}
	for issued < min(depth, n) {
		queue()
	}
	flush()
	h := make([]byte, 24)
	for done < n {
		for {
			if _, err := io.ReadFull(c.br, h[:8]); err != nil {
				b.Fatal(err)
			}
			plen := int(binary.LittleEndian.Uint32(h[4:]))
			if _, err := io.ReadFull(c.br, h[8:24]); err != nil {
				b.Fatal(err)
			}
			switch nvme.PDUType(h[0]) {
			case nvme.PDUC2HData:
				if _, err := c.br.Discard(plen - 24); err != nil {
					b.Fatal(err)
				}
			case nvme.PDUR2T:
				r, _ := nvme.ParseR2T(h)
				start := len(hdrs)
				hdrs = nvme.DataPDU{Type: nvme.PDUH2CData, Flags: nvme.FlagDataLast, CID: r.CID, TTag: r.TTag, Offset: r.Offset, Length: r.Length}.Append(hdrs, 0)
				out = append(out, hdrs[start:], c.data[r.Offset:r.Offset+r.Length])
				flush()
			case nvme.PDUCapsuleResp:
				cqe, _ := nvme.ParseCapsuleResp(h)
				if !cqe.Status.OK() {
					b.Fatalf("I/O failed: %v", cqe.Status)
				}
				done++
				if issued < n {
					queue()
				}
			default:
				b.Fatal(errors.New("unexpected PDU type " + strconv.Itoa(int(h[0]))))
			}
			if c.br.Buffered() == 0 {
				break
			}
		}
	}
}

func BenchmarkTargetCPU(b *testing.B) {
	for _, w := range []struct {
		name  string
		write bool
		size  int
		depth int
	}{{"read-4k-qd32", false, 4 << 10, 32}, {"write-4k-qd32", true, 4 << 10, 32},
		{"read-128k-qd16", false, 128 << 10, 16}, {"write-128k-qd16", true, 128 << 10, 16}} {
		b.Run(w.name, func(b *testing.B) {
			tg, bare := startChild(b, "target"), startChild(b, "bare")
			q := connectTarget(b, tg.addr, w.size)
			bq := dialWire(b, bare.addr, w.size)
			q.run(b, min(b.N, 1000), w.depth, w.write, w.size) // warm up both
			bq.run(b, min(b.N, 1000), w.depth, w.write, w.size)
			b.SetBytes(int64(w.size))
			b.ResetTimer()
			t0 := tg.usage(b)
			start := time.Now()
			q.run(b, b.N, w.depth, w.write, w.size)
			tel := time.Since(start)
			t1 := tg.usage(b)
			b.StopTimer()
			b0 := bare.usage(b)
			start = time.Now()
			bq.run(b, b.N, w.depth, w.write, w.size)
			bel := time.Since(start)
			b1 := bare.usage(b)
			// wall-clock rates, for reference only: they follow the load
			b.ReportMetric(float64(b.N)/tel.Seconds(), "target-IOPS")
			b.ReportMetric(float64(b.N)/bel.Seconds(), "bare-IOPS")
			n := float64(b.N)
			mib := n * float64(w.size) / (1 << 20)
			tcpu := float64(t1.cpu-t0.cpu) / 1e3
			bcpu := float64(b1.cpu-b0.cpu) / 1e3
			b.ReportMetric(tcpu/n, "target-cpu-us/io")
			b.ReportMetric(bcpu/n, "bare-cpu-us/io")
			b.ReportMetric(tcpu/mib, "target-cpu-us/MiB")
			b.ReportMetric(bcpu/mib, "bare-cpu-us/MiB")
			if tcpu > 0 {
				b.ReportMetric(bcpu/tcpu, "cpu-ratio")
			}
			b.ReportMetric(float64(t1.reads-t0.reads+t1.write-t0.write)/n, "target-rw-calls/io")
			b.ReportMetric(float64(b1.reads-b0.reads+b1.write-b0.write)/n, "bare-rw-calls/io")
		})
	}
}
