#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <stddef.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- libcuda -------------------------------------------------------------

typedef int (*cu_init_fn)(unsigned int);
typedef int (*cu_count_fn)(int *);
typedef int (*cu_devget_fn)(int *, int);
typedef int (*cu_devname_fn)(char *, int, int);
typedef int (*cu_errname_fn)(int, const char **);
typedef int (*cu_retain_fn)(void **, int);
typedef int (*cu_release_fn)(int);
typedef int (*cu_setcur_fn)(void *);
typedef int (*cu_alloc_fn)(uint64_t *, size_t);
typedef int (*cu_free_fn)(uint64_t);
typedef int (*cu_halloc_fn)(void **, size_t, unsigned int);
typedef int (*cu_hfree_fn)(void *);
typedef int (*cu_htod_fn)(uint64_t, const void *, size_t);
typedef int (*cu_dtoh_fn)(void *, uint64_t, size_t);

struct t0_cuda {
	void *h;
	cu_init_fn init;
	cu_count_fn count;
	cu_devget_fn devget;
	cu_devname_fn devname;
	cu_errname_fn errname;
	cu_retain_fn retain;
	cu_release_fn release;
	cu_setcur_fn setcur;
	cu_alloc_fn alloc;
	cu_free_fn free_;
	cu_halloc_fn halloc;
	cu_hfree_fn hfree;
	cu_htod_fn htod;
	cu_dtoh_fn dtoh;
};

// CUDA_ERROR_INVALID_VALUE, for calls the shim refuses itself.
#define T0_CU_INVALID 1

#define NEED(h, field, name)                                                          \
	do {                                                                          \
		*(void **)(&(field)) = dlsym((h), (name));                            \
		if ((field) == NULL) {                                                \
			snprintf(errbuf, errlen, "%s: missing symbol %s", path, (name)); \
			goto fail;                                                    \
		}                                                                     \
	} while (0)

t0_cuda *t0_cuda_open(const char *path, char *errbuf, size_t errlen) {
	t0_cuda *c = calloc(1, sizeof *c);
	if (c == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		return NULL;
	}
	c->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (c->h == NULL) {
		snprintf(errbuf, errlen, "%s", dlerror());
		free(c);
		return NULL;
	}
	NEED(c->h, c->init, "cuInit");
	NEED(c->h, c->count, "cuDeviceGetCount");
	NEED(c->h, c->devget, "cuDeviceGet");
	NEED(c->h, c->devname, "cuDeviceGetName");
	NEED(c->h, c->retain, "cuDevicePrimaryCtxRetain");
	NEED(c->h, c->release, "cuDevicePrimaryCtxRelease_v2");
	NEED(c->h, c->setcur, "cuCtxSetCurrent");
	NEED(c->h, c->alloc, "cuMemAlloc_v2");
	NEED(c->h, c->free_, "cuMemFree_v2");
	NEED(c->h, c->halloc, "cuMemHostAlloc");
	NEED(c->h, c->hfree, "cuMemFreeHost");
	NEED(c->h, c->htod, "cuMemcpyHtoD_v2");
	NEED(c->h, c->dtoh, "cuMemcpyDtoH_v2");
	*(void **)(&c->errname) = dlsym(c->h, "cuGetErrorName"); // optional
	return c;
fail:
	dlclose(c->h);
	free(c);
	return NULL;
}

int t0_cuda_init(t0_cuda *c) { return c->init(0); }

int t0_cuda_device_count(t0_cuda *c, int *n) { return c->count(n); }

void t0_cuda_error_name(t0_cuda *c, int code, char *buf, size_t len) {
	const char *s = NULL;
	if (c != NULL && c->errname != NULL && c->errname(code, &s) == 0 && s != NULL) {
		snprintf(buf, len, "%s", s);
		return;
	}
	snprintf(buf, len, "CUresult %d", code);
}

int t0_cuda_device_name(t0_cuda *c, int ordinal, char *buf, int len) {
	int dev = 0;
	int r = c->devget(&dev, ordinal);
	if (r != 0) return r;
	return c->devname(buf, len, dev);
}

int t0_cuda_ctx_retain(t0_cuda *c, int ordinal, void **ctx) {
	int dev = 0;
	int r = c->devget(&dev, ordinal);
	if (r != 0) return r;
	return c->retain(ctx, dev);
}

int t0_cuda_ctx_release(t0_cuda *c, int ordinal) {
	int dev = 0;
	int r = c->devget(&dev, ordinal);
	if (r != 0) return r;
	return c->release(dev);
}

// Every call that touches device memory first makes the context current on
// the calling OS thread: goroutines move between threads, and the CUDA
// context is per thread.
#define CUR(c, ctx)                                  \
	do {                                             \
		int r_ = (c)->setcur(ctx);                   \
		if (r_ != 0) return r_;                      \
	} while (0)

int t0_cuda_mem_alloc(t0_cuda *c, void *ctx, size_t n, uint64_t *dptr) {
	CUR(c, ctx);
	return c->alloc(dptr, n);
}

int t0_cuda_mem_free(t0_cuda *c, void *ctx, uint64_t dptr) {
	CUR(c, ctx);
	return c->free_(dptr);
}

int t0_cuda_host_alloc(t0_cuda *c, void *ctx, size_t n, void **p) {
	CUR(c, ctx);
	return c->halloc(p, n, 0);
}

int t0_cuda_host_free(t0_cuda *c, void *ctx, void *p) {
	CUR(c, ctx);
	return c->hfree(p);
}

int t0_cuda_htod(t0_cuda *c, void *ctx, uint64_t dst, const void *src, size_t n) {
	CUR(c, ctx);
	return c->htod(dst, src, n);
}

int t0_cuda_dtoh(t0_cuda *c, void *ctx, void *dst, uint64_t src, size_t n) {
	CUR(c, ctx);
	return c->dtoh(dst, src, n);
}

// ---- libcufile -----------------------------------------------------------

// CUfileDescr_t (cufile.h): enum type; union {int fd; void *handle;}; fs_ops.
typedef struct {
	int type;
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} t0_descr;

#define T0_HANDLE_TYPE_OPAQUE_FD 1

// CUfileDrvProps_t (cufile.h 1.4). Newer versions may append fields, so the
// buffer handed to the library has room to spare.
typedef struct {
	struct {
		unsigned int major_version;
		unsigned int minor_version;
		size_t poll_thresh_size;
		size_t max_direct_io_size;
		unsigned int dstatusflags;
		unsigned int dcontrolflags;
	} nvfs;
	unsigned int fflags;
	unsigned int max_device_cache_size;
	unsigned int per_buffer_cache_size;
	unsigned int max_device_pinned_mem_size;
	unsigned int max_batch_io_size;
	unsigned int max_batch_io_timeout_msecs;
	char spare[1024];
} t0_drvprops;

// Statistics structs of cuFile 1.14 (CUfileStatsLevel1_t ... Level3_t).
typedef struct {
	uint64_t ok, err;
} t0_opcnt;

typedef struct {
	t0_opcnt read_ops, write_ops, hdl_register_ops, hdl_deregister_ops, buf_register_ops,
	    buf_deregister_ops;
	uint64_t read_bytes, write_bytes, read_bw_bytes_per_sec, write_bw_bytes_per_sec,
	    read_lat_avg_us, write_lat_avg_us, read_ops_per_sec, write_ops_per_sec,
	    read_lat_sum_us, write_lat_sum_us;
	t0_opcnt batch_ops[15];
	uint64_t batch_counters[12];
} t0_stats_l1;

typedef struct {
	char uuid[16];
	uint64_t read_bytes, read_bw_bytes_per_sec, read_utilization, read_duration_us,
	    n_total_reads, n_p2p_reads, n_nvfs_reads, n_posix_reads, n_unaligned_reads,
	    n_dr_reads, n_sparse_regions, n_inline_regions, n_reads_err;
	uint64_t write_counters[11];
	uint64_t mmap_and_reg[5];
} t0_pergpu;

typedef struct {
	t0_stats_l1 basic;
	uint64_t read_size_kb_hist[32];
	uint64_t write_size_kb_hist[32];
	uint32_t num_gpus;
	t0_pergpu per_gpu[16];
	char spare[4096];
} t0_stats_l3;

_Static_assert(sizeof(t0_stats_l1) == 512, "CUfileStatsLevel1_t is 64 counters");
_Static_assert(sizeof(t0_pergpu) == 248, "CUfilePerGpuStats_t is a 16-byte uuid and 29 counters");
_Static_assert(offsetof(t0_stats_l3, num_gpus) == 1024, "CUfileStatsLevel3_t.num_gpus follows Level2");

typedef t0_cferr (*cf_void_fn)(void);
typedef t0_cferr (*cf_props_fn)(void *);
typedef t0_cferr (*cf_hreg_fn)(void **, t0_descr *);
typedef void (*cf_hdereg_fn)(void *);
typedef t0_cferr (*cf_breg_fn)(const void *, size_t, int);
typedef t0_cferr (*cf_bdereg_fn)(const void *);
typedef ssize_t (*cf_read_fn)(void *, void *, size_t, off_t, off_t);
typedef t0_cferr (*cf_level_fn)(int);
typedef t0_cferr (*cf_getstats_fn)(void *);

struct t0_cufile {
	void *h;
	cf_void_fn driver_open;
	cf_void_fn driver_close;
	cf_props_fn props;
	cf_hreg_fn hreg;
	cf_hdereg_fn hdereg;
	cf_breg_fn breg;
	cf_bdereg_fn bdereg;
	cf_read_fn read;
	// optional statistics API (cuFile >= 1.14)
	cf_level_fn set_stats_level;
	cf_void_fn stats_start;
	cf_void_fn stats_reset;
	cf_getstats_fn get_l3;
};

// libcufile prints some diagnostics on stdout; keep stdout clean for the
// caller's own output (tables, JSON) by sending fd 1 to fd 2 meanwhile.
static int stdout_to_stderr(void) {
	fflush(NULL);
	int saved = dup(1);
	if (saved >= 0) dup2(2, 1);
	return saved;
}

static void stdout_restore(int saved) {
	fflush(NULL);
	if (saved >= 0) {
		dup2(saved, 1);
		close(saved);
	}
}

t0_cufile *t0_cufile_open(const char *path, char *errbuf, size_t errlen) {
	t0_cufile *f = calloc(1, sizeof *f);
	if (f == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		return NULL;
	}
	int saved = stdout_to_stderr();
	f->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	stdout_restore(saved);
	if (f->h == NULL) {
		snprintf(errbuf, errlen, "%s", dlerror());
		free(f);
		return NULL;
	}
	NEED(f->h, f->driver_open, "cuFileDriverOpen");
	*(void **)(&f->driver_close) = dlsym(f->h, "cuFileDriverClose_v2");
	if (f->driver_close == NULL) NEED(f->h, f->driver_close, "cuFileDriverClose");
	NEED(f->h, f->props, "cuFileDriverGetProperties");
	NEED(f->h, f->hreg, "cuFileHandleRegister");
	NEED(f->h, f->hdereg, "cuFileHandleDeregister");
	NEED(f->h, f->breg, "cuFileBufRegister");
	NEED(f->h, f->bdereg, "cuFileBufDeregister");
	NEED(f->h, f->read, "cuFileRead");
	*(void **)(&f->set_stats_level) = dlsym(f->h, "cuFileSetStatsLevel");
	*(void **)(&f->stats_start) = dlsym(f->h, "cuFileStatsStart");
	*(void **)(&f->stats_reset) = dlsym(f->h, "cuFileStatsReset");
	*(void **)(&f->get_l3) = dlsym(f->h, "cuFileGetStatsL3");
	return f;
fail:
	dlclose(f->h);
	free(f);
	return NULL;
}

int t0_cufile_has_stats(t0_cufile *f) {
	return f->set_stats_level != NULL && f->stats_start != NULL && f->get_l3 != NULL;
}

t0_cferr t0_cufile_driver_open(t0_cufile *f) {
	int saved = stdout_to_stderr();
	t0_cferr e = f->driver_open();
	stdout_restore(saved);
	return e;
}

t0_cferr t0_cufile_driver_close(t0_cufile *f) {
	int saved = stdout_to_stderr();
	t0_cferr e = f->driver_close();
	stdout_restore(saved);
	return e;
}

t0_cferr t0_cufile_props(t0_cufile *f, t0_props *out) {
	t0_drvprops p;
	memset(&p, 0, sizeof p);
	t0_cferr e = f->props(&p);
	out->nvfs_major = p.nvfs.major_version;
	out->nvfs_minor = p.nvfs.minor_version;
	out->poll_thresh_size = p.nvfs.poll_thresh_size;
	out->max_direct_io_size = p.nvfs.max_direct_io_size;
	out->dstatusflags = p.nvfs.dstatusflags;
	out->dcontrolflags = p.nvfs.dcontrolflags;
	out->fflags = p.fflags;
	out->max_device_cache_size = p.max_device_cache_size;
	out->per_buffer_cache_size = p.per_buffer_cache_size;
	out->max_device_pinned_mem_size = p.max_device_pinned_mem_size;
	return e;
}

static t0_cferr cuda_err(int r) {
	// CU_FILE_CUDA_DRIVER_ERROR carries the CUresult in cu_err.
	t0_cferr e = {5011, r};
	return e;
}

t0_cferr t0_cufile_handle_register(t0_cufile *f, t0_cuda *c, void *ctx, int fd, void **fh) {
	int r = c->setcur(ctx);
	if (r != 0) return cuda_err(r);
	t0_descr d;
	memset(&d, 0, sizeof d);
	d.type = T0_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = fd;
	return f->hreg(fh, &d);
}

void t0_cufile_handle_deregister(t0_cufile *f, t0_cuda *c, void *ctx, void *fh) {
	c->setcur(ctx);
	f->hdereg(fh);
}

t0_cferr t0_cufile_buf_register(t0_cufile *f, t0_cuda *c, void *ctx, uint64_t dptr, size_t n) {
	int r = c->setcur(ctx);
	if (r != 0) return cuda_err(r);
	return f->breg((const void *)(uintptr_t)dptr, n, 0);
}

t0_cferr t0_cufile_buf_deregister(t0_cufile *f, t0_cuda *c, void *ctx, uint64_t dptr) {
	int r = c->setcur(ctx);
	if (r != 0) return cuda_err(r);
	return f->bdereg((const void *)(uintptr_t)dptr);
}

ssize_t t0_cufile_read(t0_cufile *f, t0_cuda *c, void *ctx, void *fh, uint64_t dptr,
                       size_t size, int64_t foff, int64_t doff, int *errno_out) {
	int r = c->setcur(ctx);
	if (r != 0) {
		*errno_out = 0;
		return -5011;
	}
	errno = 0;
	ssize_t n = f->read(fh, (void *)(uintptr_t)dptr, size, (off_t)foff, (off_t)doff);
	*errno_out = errno;
	return n;
}

t0_cferr t0_cufile_stats_start(t0_cufile *f, int level) {
	t0_cferr e = {0, 0};
	if (!t0_cufile_has_stats(f)) {
		e.err = 5022; // CU_FILE_INVALID_VALUE
		return e;
	}
	e = f->set_stats_level(level);
	if (e.err != 0) return e;
	if (f->stats_reset != NULL) {
		e = f->stats_reset();
		if (e.err != 0) return e;
	}
	return f->stats_start();
}

t0_cferr t0_cufile_stats_l3(t0_cufile *f, t0_stats *out) {
	t0_cferr e = {5022, 0};
	memset(out, 0, sizeof *out);
	if (!t0_cufile_has_stats(f)) return e;
	t0_stats_l3 *s = calloc(1, sizeof *s);
	if (s == NULL) return e;
	e = f->get_l3(s);
	if (e.err == 0) {
		out->read_ok = s->basic.read_ops.ok;
		out->read_err = s->basic.read_ops.err;
		out->read_bytes = s->basic.read_bytes;
		out->num_gpus = s->num_gpus;
		if (out->num_gpus > T0_MAX_GPUS) out->num_gpus = T0_MAX_GPUS;
		for (uint32_t i = 0; i < out->num_gpus; i++) {
			out->gpu[i].n_total_reads = s->per_gpu[i].n_total_reads;
			out->gpu[i].n_nvfs_reads = s->per_gpu[i].n_nvfs_reads;
			out->gpu[i].n_posix_reads = s->per_gpu[i].n_posix_reads;
			out->gpu[i].n_reads_err = s->per_gpu[i].n_reads_err;
			out->gpu[i].read_bytes = s->per_gpu[i].read_bytes;
		}
	}
	free(s);
	return e;
}
