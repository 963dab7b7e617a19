package local

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"tier0/daemon/blockdev"
)

// ErrNoDirectIO: the file system refused O_DIRECT (tmpfs before Linux 6.6,
// some FUSE and overlay file systems do).
var ErrNoDirectIO = errors.New("file system refuses O_DIRECT")

// Defaults.
const (
	DefaultFileBlockSize = 4096
	DefaultMaxInFlight   = 32
	// bounceSize is the size of one pooled bounce buffer; unaligned
	// requests larger than this are copied in pieces.
	bounceSize = 1 << 20
)

// Options tune Open.
type Options struct {
	// BlockSize is the logical block size of a regular file (512 or 4096;
	// 0 means 4096). For a block device the device's own logical block
	// size is used; a larger BlockSize (a multiple of it) may be asked.
	BlockSize int
	// Size is the size of a regular file in bytes. With Create, a missing
	// file (and its directory) is created and a shorter file extended
	// (sparsely) to Size. 0 means the file's current size rounded down to
	// the block size. On a block device a smaller Size limits the part
	// used.
	Size int64
	// Create creates a missing regular file (Size must then be set).
	Create bool
	// ReadOnly opens the device read-only; writes fail with EBADF (ErrIO).
	ReadOnly bool
	// MaxInFlight bounds concurrent system calls (0 means 32).
	MaxInFlight int
	// AllowBuffered falls back to buffered I/O (with a warning in the log)
	// where the file system refuses O_DIRECT, instead of failing with
	// ErrNoDirectIO. Flush still makes writes durable. Meant for tests.
	AllowBuffered bool
	// SyncIO uses one blocking pread/pwrite per request instead of Linux
	// native AIO.
	SyncIO bool
	// Logger receives warnings; nil discards them.
	Logger *slog.Logger
}

// Device is an open local drive or file. It implements blockdev.Device and
// blockdev.FUAWriter.
type Device struct {
	path      string
	fd        int
	size      int64
	blockSize int
	isBlock   bool
	direct    bool
	sem       chan struct{}
	ring      *aioRing // nil: synchronous system calls
	log       *slog.Logger

	mu     sync.RWMutex // held shared by requests, exclusively by Close
	closed bool

	// Features found missing at run time, so that fallbacks are taken
	// at once the next time.
	noFUA       atomic.Bool // pwritev2(RWF_DSYNC): write + fdatasync
	noZeroRange atomic.Bool // fallocate(ZERO_RANGE)
	noPunch     atomic.Bool // fallocate(PUNCH_HOLE)
	noZeroOut   atomic.Bool // BLKZEROOUT
}

var bouncePool = sync.Pool{New: func() any { b := blockdev.AlignedBuffer(bounceSize); return &b }}

// zeroBuf is an aligned buffer of zeroes for the plain zero-write fallback.
var zeroBuf = blockdev.AlignedBuffer(bounceSize)

// Open opens path (a block device or a regular file) with O_DIRECT.
func Open(path string, o Options) (*Device, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if o.ReadOnly {
		flags = unix.O_RDONLY | unix.O_CLOEXEC
	}
	if o.Create {
		flags |= unix.O_CREAT
	}
	if st, err := os.Stat(path); err == nil {
		if m := st.Mode(); !m.IsRegular() && (m&os.ModeDevice == 0 || m&os.ModeCharDevice != 0) {
			return nil, fmt.Errorf("%s: not a block device or regular file (%s)", path, m.Type())
		}
	} else if !o.Create {
		return nil, fmt.Errorf("open %s: %w", path, err)
	} else if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create the directory of %s: %w", path, err)
	}
	d := &Device{path: path, log: log, direct: true}
	fd, err := unix.Open(path, flags|unix.O_DIRECT, 0o644)
	if errors.Is(err, unix.EINVAL) {
		if !o.AllowBuffered {
			return nil, fmt.Errorf("open %s: the file system refuses O_DIRECT (tmpfs before Linux 6.6 does); put the file on a disk-backed file system such as /var/tmp: %w", path, ErrNoDirectIO)
		}
		log.Warn("O_DIRECT refused, using buffered I/O", "path", path)
		d.direct = false
		fd, err = unix.Open(path, flags, 0o644)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	d.fd = fd
	if err := d.probe(o); err != nil {
		unix.Close(fd)
		return nil, err
	}
	n := o.MaxInFlight
	if n <= 0 {
		n = DefaultMaxInFlight
	}
	d.sem = make(chan struct{}, n)
	if d.direct && !o.SyncIO {
		ring, err := newAIORing(n)
		if err != nil {
			log.Warn("Linux AIO unavailable, using synchronous I/O", "path", path, "err", err)
		} else {
			d.ring = ring
		}
	}
	return d, nil
}

func (d *Device) probe(o Options) error {
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", d.path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		d.isBlock = true
		lbs, err := unix.IoctlGetInt(d.fd, unix.BLKSSZGET)
		if err != nil {
			return fmt.Errorf("%s: BLKSSZGET: %w", d.path, err)
		}
		var size uint64
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
			return fmt.Errorf("%s: BLKGETSIZE64: %w", d.path, e)
		}
		d.blockSize = lbs
		if o.BlockSize != 0 {
			if o.BlockSize < lbs || o.BlockSize%lbs != 0 {
				return fmt.Errorf("%s: block size %d is not a multiple of the device's logical block size %d: %w", d.path, o.BlockSize, lbs, blockdev.ErrMisaligned)
			}
			d.blockSize = o.BlockSize
		}
		d.size = int64(size) / int64(d.blockSize) * int64(d.blockSize)
		if o.Size > 0 && o.Size < d.size {
			d.size = o.Size / int64(d.blockSize) * int64(d.blockSize)
		}
	case unix.S_IFREG:
		d.blockSize = o.BlockSize
		if d.blockSize == 0 {
			d.blockSize = DefaultFileBlockSize
		}
		if d.blockSize != 512 && d.blockSize != 4096 {
			return fmt.Errorf("%s: block size %d: expected 512 or 4096", d.path, d.blockSize)
		}
		d.size = st.Size
		if o.Size > 0 {
			if o.Size%int64(d.blockSize) != 0 {
				return fmt.Errorf("%s: size %d is not a multiple of the block size %d: %w", d.path, o.Size, d.blockSize, blockdev.ErrMisaligned)
			}
			if st.Size < o.Size {
				if !o.Create {
					return fmt.Errorf("%s: file is %d bytes, smaller than the configured size %d; enlarge it or let tier0 create it", d.path, st.Size, o.Size)
				}
				if err := unix.Ftruncate(d.fd, o.Size); err != nil {
					return fmt.Errorf("%s: extend to %d bytes: %w", d.path, o.Size, err)
				}
			}
			d.size = o.Size
		}
		d.size = d.size / int64(d.blockSize) * int64(d.blockSize)
		if d.size == 0 {
			return fmt.Errorf("%s: empty file; set a size to create it: %w", d.path, blockdev.ErrOutOfRange)
		}
	default:
		return fmt.Errorf("%s: not a block device or regular file (mode %o)", d.path, st.Mode&unix.S_IFMT)
	}
	return nil
}

// Path returns the path the device was opened with.
func (d *Device) Path() string { return d.path }

// Direct reports whether the device uses O_DIRECT (false only after an
// AllowBuffered fallback).
func (d *Device) Direct() bool { return d.direct }

// Engine names the I/O path: "aio", "sync" or "buffered".
func (d *Device) Engine() string {
	switch {
	case !d.direct:
		return "buffered"
	case d.ring != nil:
		return "aio"
	}
	return "sync"
}

// IsBlockDevice reports whether the path is a block device.
func (d *Device) IsBlockDevice() bool { return d.isBlock }

// Size implements blockdev.Device.
func (d *Device) Size() int64 { return d.size }

// BlockSize implements blockdev.Device.
func (d *Device) BlockSize() int { return d.blockSize }

// begin takes the shared lock and checks the range; end releases it.
func (d *Device) begin(off, length int64) error {
	d.mu.RLock()
	if d.closed {
		d.mu.RUnlock()
		return fmt.Errorf("%s: %w", d.path, blockdev.ErrClosed)
	}
	if err := blockdev.CheckRange(off, length, d.size, d.blockSize); err != nil {
		d.mu.RUnlock()
		return fmt.Errorf("%s: %w", d.path, err)
	}
	return nil
}

func (d *Device) end() { d.mu.RUnlock() }

func (d *Device) ioErr(op string, off int64, n int, err error) error {
	return fmt.Errorf("%s %s off=%d len=%d: %w: %w", op, d.path, off, n, blockdev.ErrIO, err)
}

// pio runs one positional read or write to completion (retrying EINTR
// and continuing short transfers), holding a semaphore slot.
func (d *Device) pio(write bool, p []byte, off int64, fua bool) (int, error) {
	if d.ring != nil {
		var flags uint32
		if fua {
			flags = unix.RWF_DSYNC
		}
		done := 0
		for done < len(p) {
			n, err := d.ring.do(d.fd, write, p[done:], off+int64(done), flags)
			if err != nil {
				return done, err
			}
			if n == 0 {
				return done, fmt.Errorf("unexpected end of file at %d", off+int64(done))
			}
			done += n
		}
		return done, nil
	}
	d.sem <- struct{}{}
	defer func() { <-d.sem }()
	done := 0
	for done < len(p) {
		var n int
		var err error
		switch {
		case !write:
			n, err = unix.Pread(d.fd, p[done:], off+int64(done))
		case fua:
			n, err = unix.Pwritev2(d.fd, [][]byte{p[done:]}, off+int64(done), unix.RWF_DSYNC)
		default:
			n, err = unix.Pwrite(d.fd, p[done:], off+int64(done))
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, fmt.Errorf("unexpected end of file at %d", off+int64(done))
		}
		done += n
	}
	return done, nil
}

// rw performs a whole request, through bounce buffers when p is unaligned.
func (d *Device) rw(write bool, p []byte, off int64, fua bool) (int, error) {
	if blockdev.IsAligned(p) || !d.direct {
		return d.pio(write, p, off, fua)
	}
	bp := bouncePool.Get().(*[]byte)
	defer bouncePool.Put(bp)
	done := 0
	for done < len(p) {
		chunk := min(len(p)-done, bounceSize)
		b := (*bp)[:chunk]
		if write {
			copy(b, p[done:])
		}
		n, err := d.pio(write, b, off+int64(done), fua)
		if !write {
			copy(p[done:], b[:n])
		}
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// ReadAt implements blockdev.Device.
func (d *Device) ReadAt(p []byte, off int64) (int, error) {
	if err := d.begin(off, int64(len(p))); err != nil {
		return 0, err
	}
	defer d.end()
	n, err := d.rw(false, p, off, false)
	if err != nil {
		return n, d.ioErr("read", off, len(p), err)
	}
	return n, nil
}

// WriteAt implements blockdev.Device.
func (d *Device) WriteAt(p []byte, off int64) (int, error) {
	if err := d.begin(off, int64(len(p))); err != nil {
		return 0, err
	}
	defer d.end()
	n, err := d.rw(true, p, off, false)
	if err != nil {
		return n, d.ioErr("write", off, len(p), err)
	}
	return n, nil
}

// WriteAtFUA implements blockdev.FUAWriter with pwritev2(RWF_DSYNC), or a
// write followed by fdatasync where the kernel lacks it.
func (d *Device) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := d.begin(off, int64(len(p))); err != nil {
		return 0, err
	}
	defer d.end()
	if !d.noFUA.Load() {
		n, err := d.rw(true, p, off, true)
		if err == nil {
			return n, nil
		}
		// EINVAL: an old kernel that knows neither RWF_DSYNC in AIO
		// nor pwritev2 flags (the range itself was checked).
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
			return n, d.ioErr("write-fua", off, len(p), err)
		}
		d.noFUA.Store(true)
	}
	n, err := d.rw(true, p, off, false)
	if err == nil {
		err = d.fdatasync()
	}
	if err != nil {
		return n, d.ioErr("write-fua", off, len(p), err)
	}
	return n, nil
}

func (d *Device) fdatasync() error {
	d.sem <- struct{}{}
	defer func() { <-d.sem }()
	for {
		if err := unix.Fdatasync(d.fd); err != unix.EINTR {
			return err
		}
	}
}

// Flush implements blockdev.Device with fdatasync.
func (d *Device) Flush() error {
	if err := d.begin(0, 0); err != nil {
		return err
	}
	defer d.end()
	if err := d.fdatasync(); err != nil {
		return fmt.Errorf("flush %s: %w: %w", d.path, blockdev.ErrIO, err)
	}
	return nil
}

func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY)
}

// WriteZeroes implements blockdev.Device: fallocate(ZERO_RANGE) on files,
// BLKZEROOUT on block devices, and writing zeroes where neither works.
func (d *Device) WriteZeroes(off, length int64) error {
	if err := d.begin(off, length); err != nil {
		return err
	}
	defer d.end()
	if length == 0 {
		return nil
	}
	var err error
	if d.isBlock {
		err = d.blkRange(unix.BLKZEROOUT, off, length, &d.noZeroOut)
	} else {
		err = d.fallocate(unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, length, &d.noZeroRange)
		if err != nil && unsupported(err) {
			err = d.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length, &d.noPunch)
		}
	}
	if err != nil && unsupported(err) {
		err = d.writeZeroes(off, length)
	}
	if err != nil {
		return fmt.Errorf("write zeroes %s off=%d len=%d: %w: %w", d.path, off, length, blockdev.ErrIO, err)
	}
	return nil
}

// Discard implements blockdev.Device: the range is deallocated where the
// medium can do that and still read back zeroes (fallocate PUNCH_HOLE on
// files and block devices, BLKZEROOUT with unmapping allowed), and written
// with zeroes otherwise. BLKDISCARD is not used because it does not
// guarantee zeroes afterwards.
func (d *Device) Discard(off, length int64) error {
	if err := d.begin(off, length); err != nil {
		return err
	}
	defer d.end()
	if length == 0 {
		return nil
	}
	err := d.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length, &d.noPunch)
	if err != nil && unsupported(err) && d.isBlock {
		err = d.blkRange(unix.BLKZEROOUT, off, length, &d.noZeroOut)
	}
	if err != nil && unsupported(err) {
		err = d.writeZeroes(off, length)
	}
	if err != nil {
		return fmt.Errorf("discard %s off=%d len=%d: %w: %w", d.path, off, length, blockdev.ErrIO, err)
	}
	return nil
}

func (d *Device) fallocate(mode uint32, off, length int64, missing *atomic.Bool) error {
	if missing.Load() {
		return unix.EOPNOTSUPP
	}
	d.sem <- struct{}{}
	defer func() { <-d.sem }()
	for {
		err := unix.Fallocate(d.fd, mode, off, length)
		if err == unix.EINTR {
			continue
		}
		if err != nil && unsupported(err) {
			missing.Store(true)
		}
		return err
	}
}

func (d *Device) blkRange(req uint, off, length int64, missing *atomic.Bool) error {
	if missing.Load() {
		return unix.EOPNOTSUPP
	}
	d.sem <- struct{}{}
	defer func() { <-d.sem }()
	r := [2]uint64{uint64(off), uint64(length)}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), uintptr(req), uintptr(unsafe.Pointer(&r)))
	if e != 0 {
		if unsupported(e) {
			missing.Store(true)
		}
		return e
	}
	return nil
}

func (d *Device) writeZeroes(off, length int64) error {
	for length > 0 {
		n := min(length, int64(len(zeroBuf)))
		if _, err := d.pio(true, zeroBuf[:n], off, false); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// Close implements blockdev.Device. It waits for requests in flight.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("%s: close twice: %w", d.path, blockdev.ErrClosed)
	}
	d.closed = true
	var ringErr error
	if d.ring != nil {
		ringErr = d.ring.close(d.fd)
	}
	if err := unix.Close(d.fd); err != nil {
		return fmt.Errorf("close %s: %w", d.path, err)
	}
	if ringErr != nil {
		return fmt.Errorf("close %s: %w", d.path, ringErr)
	}
	return nil
}

var (
	_ blockdev.Device    = (*Device)(nil)
	_ blockdev.FUAWriter = (*Device)(nil)
)
