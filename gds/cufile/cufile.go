//go:build cgo && linux

package cufile

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Built reports whether this binary carries the cgo bindings.
const Built = true

// CUDA is an open libcuda (the CUDA driver API).
type CUDA struct {
	c    *C.t0_cuda
	path string
}

// OpenCUDA loads the CUDA driver library at path (a soname such as
// "libcuda.so.1" is searched like any dlopen). A missing library or symbol
// wraps ErrNoCUDA.
func OpenCUDA(path string) (*CUDA, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	c := C.t0_cuda_open(cpath, &buf[0], C.size_t(len(buf)))
	if c == nil {
		return nil, fmt.Errorf("%w: dlopen %s: %s", ErrNoCUDA, path, C.GoString(&buf[0]))
	}
	return &CUDA{c: c, path: path}, nil
}

// Path is the name the library was loaded by.
func (d *CUDA) Path() string { return d.path }

func (d *CUDA) err(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	var buf [128]C.char
	C.t0_cuda_error_name(d.c, r, &buf[0], C.size_t(len(buf)))
	return &CUDAError{Call: call, Code: int(r), Name: C.GoString(&buf[0])}
}

// Init calls cuInit(0).
func (d *CUDA) Init() error { return d.err("cuInit", C.t0_cuda_init(d.c)) }

// DeviceCount calls cuDeviceGetCount.
func (d *CUDA) DeviceCount() (int, error) {
	var n C.int
	if err := d.err("cuDeviceGetCount", C.t0_cuda_device_count(d.c, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// DeviceName returns the marketing name of GPU ordinal.
func (d *CUDA) DeviceName(ordinal int) (string, error) {
	var buf [256]C.char
	if err := d.err("cuDeviceGetName", C.t0_cuda_device_name(d.c, C.int(ordinal), &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// Context is a retained primary context of one GPU. Every method makes it
// current on the calling thread first, so it may be used from any goroutine.
type Context struct {
	d       *CUDA
	ctx     unsafe.Pointer
	ordinal int
}

// PrimaryContext retains the primary context of GPU ordinal
// (cuDevicePrimaryCtxRetain). Release it with Context.Release.
func (d *CUDA) PrimaryContext(ordinal int) (*Context, error) {
	var ctx unsafe.Pointer
	if err := d.err("cuDevicePrimaryCtxRetain", C.t0_cuda_ctx_retain(d.c, C.int(ordinal), &ctx)); err != nil {
		return nil, err
	}
	return &Context{d: d, ctx: ctx, ordinal: ordinal}, nil
}

// Release drops the primary context reference.
func (x *Context) Release() error {
	return x.d.err("cuDevicePrimaryCtxRelease", C.t0_cuda_ctx_release(x.d.c, C.int(x.ordinal)))
}

// DevPtr is a CUDA device address (CUdeviceptr).
type DevPtr uint64

// MemAlloc allocates n bytes of device memory (cuMemAlloc).
func (x *Context) MemAlloc(n int) (DevPtr, error) {
	var p C.uint64_t
	if err := x.d.err("cuMemAlloc", C.t0_cuda_mem_alloc(x.d.c, x.ctx, C.size_t(n), &p)); err != nil {
		return 0, err
	}
	return DevPtr(p), nil
}

// MemFree frees device memory (cuMemFree).
func (x *Context) MemFree(p DevPtr) error {
	return x.d.err("cuMemFree", C.t0_cuda_mem_free(x.d.c, x.ctx, C.uint64_t(p)))
}

// HostAlloc allocates n bytes of pinned, page-aligned host memory
// (cuMemHostAlloc). The slice is valid until HostFree; it is not Go memory.
func (x *Context) HostAlloc(n int) ([]byte, error) {
	var p unsafe.Pointer
	if err := x.d.err("cuMemHostAlloc", C.t0_cuda_host_alloc(x.d.c, x.ctx, C.size_t(n), &p)); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// HostFree frees memory from HostAlloc (cuMemFreeHost).
func (x *Context) HostFree(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return x.d.err("cuMemFreeHost", C.t0_cuda_host_free(x.d.c, x.ctx, unsafe.Pointer(&b[0])))
}

// CopyHtoD copies src into device memory at dst (cuMemcpyHtoD). src must
// not be Go memory that the collector may move: use HostAlloc memory.
func (x *Context) CopyHtoD(dst DevPtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return x.d.err("cuMemcpyHtoD", C.t0_cuda_htod(x.d.c, x.ctx, C.uint64_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

// CopyDtoH copies len(dst) bytes from device memory at src (cuMemcpyDtoH).
func (x *Context) CopyDtoH(dst []byte, src DevPtr) error {
	if len(dst) == 0 {
		return nil
	}
	buf := C.malloc(C.size_t(len(dst)))
	defer C.free(buf)
	if err := x.d.err("cuMemcpyDtoH", C.t0_cuda_dtoh(x.d.c, x.ctx, buf, C.uint64_t(src), C.size_t(len(dst)))); err != nil {
		return err
	}
	copy(dst, unsafe.Slice((*byte)(buf), len(dst)))
	return nil
}

// Lib is an open libcufile.
type Lib struct {
	f    *C.t0_cufile
	path string
}

// Open loads libcufile at path ("libcufile.so.0" by default in callers). A
// missing library or core symbol wraps ErrNoCufile.
func Open(path string) (*Lib, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	f := C.t0_cufile_open(cpath, &buf[0], C.size_t(len(buf)))
	if f == nil {
		return nil, fmt.Errorf("%w: dlopen %s: %s", ErrNoCufile, path, C.GoString(&buf[0]))
	}
	return &Lib{f: f, path: path}, nil
}

// Path is the name the library was loaded by.
func (l *Lib) Path() string { return l.path }

// HasStatsAPI reports whether the library exports the statistics API
// (cuFileSetStatsLevel, cuFileStatsStart, cuFileGetStatsL3).
func (l *Lib) HasStatsAPI() bool { return C.t0_cufile_has_stats(l.f) != 0 }

func cfErr(call string, e C.t0_cferr) error {
	if e.err == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(e.err), CUResult: int(e.cu_err)}
}

// DriverOpen calls cuFileDriverOpen. cuFile reads its configuration
// (CUFILE_ENV_PATH_JSON, CUFILE_LOGFILE_PATH, CUFILE_ALLOW_COMPAT_MODE) here.
func (l *Lib) DriverOpen() error {
	return cfErr("cuFileDriverOpen", C.t0_cufile_driver_open(l.f))
}

// DriverClose calls cuFileDriverClose_v2 (or cuFileDriverClose).
func (l *Lib) DriverClose() error {
	return cfErr("cuFileDriverClose", C.t0_cufile_driver_close(l.f))
}

// Properties calls cuFileDriverGetProperties. Note that libcufile 1.4
// returns success with zero nvfs versions even when the driver failed to
// open: the properties alone prove nothing.
func (l *Lib) Properties() (Props, error) {
	var p C.t0_props
	err := cfErr("cuFileDriverGetProperties", C.t0_cufile_props(l.f, &p))
	return Props{
		NvfsMajor:              int(p.nvfs_major),
		NvfsMinor:              int(p.nvfs_minor),
		PollThreshSize:         int64(p.poll_thresh_size),
		MaxDirectIOSize:        int64(p.max_direct_io_size),
		StatusFlags:            uint32(p.dstatusflags),
		ControlFlags:           uint32(p.dcontrolflags),
		FeatureFlags:           uint32(p.fflags),
		MaxDeviceCacheSize:     int64(p.max_device_cache_size),
		PerBufferCacheSize:     int64(p.per_buffer_cache_size),
		MaxDevicePinnedMemSize: int64(p.max_device_pinned_mem_size),
	}, err
}

// Handle is a registered file (CUfileHandle_t).
type Handle struct {
	l   *Lib
	x   *Context
	fh  unsafe.Pointer
	fd  int
	reg bool
}

// HandleRegister registers fd (opened with O_DIRECT) with cuFile.
func (l *Lib) HandleRegister(x *Context, fd int) (*Handle, error) {
	var fh unsafe.Pointer
	if err := cfErr("cuFileHandleRegister", C.t0_cufile_handle_register(l.f, x.d.c, x.ctx, C.int(fd), &fh)); err != nil {
		return nil, err
	}
	return &Handle{l: l, x: x, fh: fh, fd: fd, reg: true}, nil
}

// Deregister releases the handle; the fd stays open.
func (h *Handle) Deregister() {
	if h.reg {
		C.t0_cufile_handle_deregister(h.l.f, h.x.d.c, h.x.ctx, h.fh)
		h.reg = false
	}
}

// BufRegister registers n bytes of device memory at p (cuFileBufRegister).
func (l *Lib) BufRegister(x *Context, p DevPtr, n int) error {
	return cfErr("cuFileBufRegister", C.t0_cufile_buf_register(l.f, x.d.c, x.ctx, C.uint64_t(p), C.size_t(n)))
}

// BufDeregister undoes BufRegister.
func (l *Lib) BufDeregister(x *Context, p DevPtr) error {
	return cfErr("cuFileBufDeregister", C.t0_cufile_buf_deregister(l.f, x.d.c, x.ctx, C.uint64_t(p)))
}

// Read reads size bytes at fileOff into device memory p+devOff (cuFileRead).
// It returns the byte count, or an *Error (a CUfileOpError) or a
// syscall.Errno for a failed call.
func (h *Handle) Read(p DevPtr, size int, fileOff, devOff int64) (int, error) {
	var eno C.int
	n := C.t0_cufile_read(h.l.f, h.x.d.c, h.x.ctx, h.fh, C.uint64_t(p), C.size_t(size), C.int64_t(fileOff), C.int64_t(devOff), &eno)
	switch {
	case n >= 0:
		return int(n), nil
	case n == -1:
		return 0, fmt.Errorf("cuFileRead at offset %d: %w", fileOff, syscall.Errno(eno))
	default:
		return 0, &Error{Call: "cuFileRead", Code: int(-n)}
	}
}

// StatsStart sets the statistics level (1..3), resets and starts the
// in-process counters. It fails with CU_FILE_INVALID_VALUE when the library
// has no statistics API (see HasStatsAPI).
func (l *Lib) StatsStart(level int) error {
	return cfErr("cuFileSetStatsLevel/cuFileStatsStart", C.t0_cufile_stats_start(l.f, C.int(level)))
}

// Stats reads the level-3 counters (cuFileGetStatsL3).
func (l *Lib) Stats() (Stats, error) {
	var s C.t0_stats
	if err := cfErr("cuFileGetStatsL3", C.t0_cufile_stats_l3(l.f, &s)); err != nil {
		return Stats{}, err
	}
	out := Stats{ReadOK: uint64(s.read_ok), ReadErr: uint64(s.read_err), ReadBytes: uint64(s.read_bytes)}
	for i := 0; i < int(s.num_gpus); i++ {
		g := s.gpu[i]
		out.GPUs = append(out.GPUs, GPUStats{
			Index:      i,
			TotalReads: uint64(g.n_total_reads),
			NvfsReads:  uint64(g.n_nvfs_reads),
			PosixReads: uint64(g.n_posix_reads),
			ReadErrors: uint64(g.n_reads_err),
			ReadBytes:  uint64(g.read_bytes),
		})
	}
	return out, nil
}
