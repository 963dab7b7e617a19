// Thin C layer over libcufile and libcuda, both loaded at run time with
// dlopen so that the tier0 binary builds and runs on hosts without them.
//
// The struct layouts below are written out here (not taken from cufile.h or
// cuda.h) so that no NVIDIA header is needed at build time. They follow the
// ABI of cuFile 1.4 (CUDA 11.8, Debian's libcufile0) for the core API and of
// cuFile 1.14 (CUDA 12.9) for the optional statistics API.
#ifndef TIER0_CUFILE_SHIM_H
#define TIER0_CUFILE_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// CUfileError_t: {CUfileOpError err; CUresult cu_err;}, both enums.
typedef struct {
	int err;
	int cu_err;
} t0_cferr;

// The fields of CUfileDrvProps_t the validator reports.
typedef struct {
	unsigned int nvfs_major;
	unsigned int nvfs_minor;
	size_t poll_thresh_size;
	size_t max_direct_io_size;
	unsigned int dstatusflags;
	unsigned int dcontrolflags;
	unsigned int fflags;
	unsigned int max_device_cache_size;
	unsigned int per_buffer_cache_size;
	unsigned int max_device_pinned_mem_size;
} t0_props;

#define T0_MAX_GPUS 16

// The counters the validator takes from cuFileGetStatsL3.
typedef struct {
	uint64_t read_ok, read_err, read_bytes;
	uint32_t num_gpus;
	struct {
		uint64_t n_total_reads, n_nvfs_reads, n_posix_reads, n_reads_err, read_bytes;
	} gpu[T0_MAX_GPUS];
} t0_stats;

typedef struct t0_cuda t0_cuda;
typedef struct t0_cufile t0_cufile;

t0_cuda *t0_cuda_open(const char *path, char *errbuf, size_t errlen);
int t0_cuda_init(t0_cuda *c);
int t0_cuda_device_count(t0_cuda *c, int *n);
void t0_cuda_error_name(t0_cuda *c, int code, char *buf, size_t len);
int t0_cuda_device_name(t0_cuda *c, int ordinal, char *buf, int len);
int t0_cuda_ctx_retain(t0_cuda *c, int ordinal, void **ctx);
int t0_cuda_ctx_release(t0_cuda *c, int ordinal);
int t0_cuda_mem_alloc(t0_cuda *c, void *ctx, size_t n, uint64_t *dptr);
int t0_cuda_mem_free(t0_cuda *c, void *ctx, uint64_t dptr);
int t0_cuda_host_alloc(t0_cuda *c, void *ctx, size_t n, void **p);
int t0_cuda_host_free(t0_cuda *c, void *ctx, void *p);
int t0_cuda_htod(t0_cuda *c, void *ctx, uint64_t dst, const void *src, size_t n);
int t0_cuda_dtoh(t0_cuda *c, void *ctx, void *dst, uint64_t src, size_t n);

t0_cufile *t0_cufile_open(const char *path, char *errbuf, size_t errlen);
int t0_cufile_has_stats(t0_cufile *f);
t0_cferr t0_cufile_driver_open(t0_cufile *f);
t0_cferr t0_cufile_driver_close(t0_cufile *f);
t0_cferr t0_cufile_props(t0_cufile *f, t0_props *out);
t0_cferr t0_cufile_handle_register(t0_cufile *f, t0_cuda *c, void *ctx, int fd, void **fh);
void t0_cufile_handle_deregister(t0_cufile *f, t0_cuda *c, void *ctx, void *fh);
t0_cferr t0_cufile_buf_register(t0_cufile *f, t0_cuda *c, void *ctx, uint64_t dptr, size_t n);
t0_cferr t0_cufile_buf_deregister(t0_cufile *f, t0_cuda *c, void *ctx, uint64_t dptr);
ssize_t t0_cufile_read(t0_cufile *f, t0_cuda *c, void *ctx, void *fh, uint64_t dptr,
                       size_t size, int64_t foff, int64_t doff, int *errno_out);
t0_cferr t0_cufile_stats_start(t0_cufile *f, int level);
t0_cferr t0_cufile_stats_l3(t0_cufile *f, t0_stats *out);

#endif
