package cufile

import (
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	// ErrNoCufile: libcufile could not be loaded or lacks a core symbol.
	ErrNoCufile = errors.New("libcufile not loadable")
	// ErrNoCUDA: libcuda (the NVIDIA driver's CUDA library) could not be
	// loaded or lacks a symbol.
	ErrNoCUDA = errors.New("libcuda not loadable")
	// ErrNotBuilt: this binary was built without cgo, so it has no cuFile
	// bindings at all.
	ErrNotBuilt = errors.New("built without cgo: no cuFile bindings")
)

// Error is a failed cuFile call: Code is the CUfileOpError (5000+n), and
// CUResult the CUDA driver error when Code is CU_FILE_CUDA_DRIVER_ERROR.
type Error struct {
	Call     string
	Code     int
	CUResult int
}

// Error-code values used by the validator (cufile.h).
const (
	CodeDriverNotInitialized = 5001
	CodePlatformNotSupported = 5007
	CodeIONotSupported       = 5008
	CodeDeviceNotSupported   = 5009
	CodeCUDADriverError      = 5011
	CodeNvfsSetupError       = 5033
	CodeIODisabled           = 5034
)

var codeText = map[int]string{
	5001: "CU_FILE_DRIVER_NOT_INITIALIZED: nvidia-fs driver is not loaded",
	5002: "CU_FILE_DRIVER_INVALID_PROPS: invalid property",
	5003: "CU_FILE_DRIVER_UNSUPPORTED_LIMIT: property range error",
	5004: "CU_FILE_DRIVER_VERSION_MISMATCH: nvidia-fs driver version mismatch",
	5005: "CU_FILE_DRIVER_VERSION_READ_ERROR: nvidia-fs driver version read error",
	5006: "CU_FILE_DRIVER_CLOSING: driver shutdown in progress",
	5007: "CU_FILE_PLATFORM_NOT_SUPPORTED: GPUDirect Storage not supported on current platform",
	5008: "CU_FILE_IO_NOT_SUPPORTED: GPUDirect Storage not supported on current file",
	5009: "CU_FILE_DEVICE_NOT_SUPPORTED: GPUDirect Storage not supported on current GPU",
	5010: "CU_FILE_NVFS_DRIVER_ERROR: nvidia-fs driver ioctl error",
	5011: "CU_FILE_CUDA_DRIVER_ERROR: CUDA driver API error",
	5012: "CU_FILE_CUDA_POINTER_INVALID: invalid device pointer",
	5013: "CU_FILE_CUDA_MEMORY_TYPE_INVALID: invalid pointer memory type",
	5014: "CU_FILE_CUDA_POINTER_RANGE_ERROR: pointer range exceeds allocated address range",
	5015: "CU_FILE_CUDA_CONTEXT_MISMATCH: cuda context mismatch",
	5016: "CU_FILE_INVALID_MAPPING_SIZE: access beyond maximum pinned size",
	5017: "CU_FILE_INVALID_MAPPING_RANGE: access beyond mapped size",
	5018: "CU_FILE_INVALID_FILE_TYPE: unsupported file type",
	5019: "CU_FILE_INVALID_FILE_OPEN_FLAG: unsupported file open flags",
	5020: "CU_FILE_DIO_NOT_SET: fd direct IO not set",
	5022: "CU_FILE_INVALID_VALUE: invalid arguments",
	5023: "CU_FILE_MEMORY_ALREADY_REGISTERED: device pointer already registered",
	5024: "CU_FILE_MEMORY_NOT_REGISTERED: device pointer lookup failure",
	5025: "CU_FILE_PERMISSION_DENIED: driver or file access error",
	5026: "CU_FILE_DRIVER_ALREADY_OPEN: driver is already open",
	5027: "CU_FILE_HANDLE_NOT_REGISTERED: file descriptor is not registered",
	5028: "CU_FILE_HANDLE_ALREADY_REGISTERED: file descriptor is already registered",
	5029: "CU_FILE_DEVICE_NOT_FOUND: GPU device not found",
	5030: "CU_FILE_INTERNAL_ERROR: internal error",
	5031: "CU_FILE_GETNEWFD_FAILED: failed to obtain new file descriptor",
	5033: "CU_FILE_NVFS_SETUP_ERROR: NVFS driver initialization error",
	5034: "CU_FILE_IO_DISABLED: GPUDirect Storage disabled by config on current file",
	5035: "CU_FILE_BATCH_SUBMIT_FAILED: failed to submit batch operation",
	5036: "CU_FILE_GPU_MEMORY_PINNING_FAILED: failed to allocate pinned GPU memory",
}

// CodeText names a CUfileOpError value.
func CodeText(code int) string {
	if s, ok := codeText[code]; ok {
		return s
	}
	return "unknown cuFile error"
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: error %d (%s)", e.Call, e.Code, CodeText(e.Code))
	if e.Code == CodeCUDADriverError && e.CUResult != 0 {
		s += fmt.Sprintf(", CUresult %d", e.CUResult)
	}
	return s
}

// CUDAError is a failed CUDA driver call.
type CUDAError struct {
	Call string
	Code int    // CUresult
	Name string // e.g. CUDA_ERROR_NO_DEVICE
}

func (e *CUDAError) Error() string {
	return fmt.Sprintf("%s: %s (CUresult %d)", e.Call, e.Name, e.Code)
}

// Props is what cuFileDriverGetProperties reports.
type Props struct {
	NvfsMajor              int    `json:"nvfs_major"`
	NvfsMinor              int    `json:"nvfs_minor"`
	PollThreshSize         int64  `json:"poll_thresh_size"`
	MaxDirectIOSize        int64  `json:"max_direct_io_size"`
	StatusFlags            uint32 `json:"status_flags"`
	ControlFlags           uint32 `json:"control_flags"`
	FeatureFlags           uint32 `json:"feature_flags"`
	MaxDeviceCacheSize     int64  `json:"max_device_cache_size"`
	PerBufferCacheSize     int64  `json:"per_buffer_cache_size"`
	MaxDevicePinnedMemSize int64  `json:"max_device_pinned_mem_size"`
}

// AllowCompat reports whether the driver's control flags allow compat mode
// (CU_FILE_ALLOW_COMPAT_MODE, bit 1).
func (p Props) AllowCompat() bool { return p.ControlFlags&(1<<1) != 0 }

// Stats are the in-process cuFile counters (statistics API, level 3).
type Stats struct {
	ReadOK    uint64     `json:"read_ok"`
	ReadErr   uint64     `json:"read_err"`
	ReadBytes uint64     `json:"read_bytes"`
	GPUs      []GPUStats `json:"gpus,omitempty"`
}

// GPUStats are the per-GPU read counters of Stats.
type GPUStats struct {
	Index      int    `json:"index"`
	TotalReads uint64 `json:"total_reads"`
	NvfsReads  uint64 `json:"nvfs_reads"`
	PosixReads uint64 `json:"posix_reads"`
	ReadErrors uint64 `json:"read_errors"`
	ReadBytes  uint64 `json:"read_bytes"`
}
