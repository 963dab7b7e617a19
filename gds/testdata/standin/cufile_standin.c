// Test-only stand-in for libcufile.so.0. cuFileRead preads into the
// "device" pointer (host memory from the stand-in libcuda) and accounts for
// each read like the real stack would:
//   - a direct read bumps the nvidia-fs "Reads" counters in the fake stats
//     file STANDIN_NVFS_STATS (n/ok only while STANDIN_NVFS_PARAMS/
//     rw_stats_enabled is 1, as the kernel module does);
//   - with STANDIN_POSIX_EVERY=N every Nth read falls back to POSIX: no
//     nvidia-fs count, cuFile's posix counter goes up and a compat NOTICE
//     goes to CUFILE_LOGFILE_PATH; with CUFILE_ALLOW_COMPAT_MODE=false that
//     read fails with CU_FILE_IO_NOT_SUPPORTED instead.
//   - STANDIN_DRIVER_OPEN_ERR=N makes cuFileDriverOpen fail with N.
//   - STANDIN_COMPAT_ONLY=1 opens the driver in compat mode only (nvfs
//     version 0.0 and a "running in compatible mode" notice).
// Built with -DSTANDIN_NO_STATS_API it lacks the statistics API and instead
// writes gds_stats -l 3 output to STANDIN_GDS_STATS_OUT after every read.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct { int err; int cu_err; } cferr;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } descr;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long nvfs_n, nvfs_ok, n_reads, n_posix, n_nvfs, read_bytes;
static int posix_every, strict, opened;

static const char *env(const char *k) { const char *v = getenv(k); return v ? v : ""; }

static int rw_stats_enabled(void) {
	char p[4096];
	snprintf(p, sizeof p, "%s/rw_stats_enabled", env("STANDIN_NVFS_PARAMS"));
	FILE *f = fopen(p, "r");
	if (!f) return 0;
	int c = fgetc(f);
	fclose(f);
	return c == '1';
}

static void write_nvfs(void) {
	const char *path = env("STANDIN_NVFS_STATS");
	if (!*path) return;
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f) return;
	int on = rw_stats_enabled();
	fprintf(f, "GDS Version: 1.10.0.4 \nNVFS statistics(ver: 4.0)\nNVFS Driver(version: 2.20.5)\n");
	fprintf(f, "Mellanox PeerDirect Supported: False\nIO stats: %s, peer IO stats: Disabled\nLogging level: info\n\n",
	        on ? "Enabled" : "Disabled");
	fprintf(f, "Active Shadow-Buffer (MiB): 0\nActive Process: 1\n");
	if (on) {
		fprintf(f, "Reads\t\t\t\t: n=%lld ok=%lld err=0 readMiB=%lld io_state_err=0\n", nvfs_n, nvfs_ok, read_bytes >> 20);
		fprintf(f, "Reads\t\t\t\t: Bandwidth(MiB/s)=0 Avg-Latency(usec)=0\n");
	} else {
		fprintf(f, "Reads                : err=0 io_state_err=0\n");
	}
	fprintf(f, "Ops\t\t\t\t: Read=0 Write=0 BatchIO=0\n");
	fclose(f);
	rename(tmp, path);
}

__attribute__((unused)) static void write_gds_stats(void) {
	const char *path = env("STANDIN_GDS_STATS_OUT");
	if (!*path) return;
	FILE *f = fopen(path, "w");
	if (!f) return;
	fprintf(f, "cuFile STATS VERSION : 3\nGLOBAL STATS:\nTotal Files: 1\nTotal Read Errors : 0\n");
	fprintf(f, "Total Read Size (MiB): %lld\nPER_GPU STATS:\n", read_bytes >> 20);
	fprintf(f, "GPU 0 Read: bw=0 util(%%)=0 n=%lld posix=%lld unalign=0 r_sparse=0 r_inline=0 err=0 MiB=%lld "
	           "Write: bw=0 util(%%)=0 n=0 posix=0 unalign=0 err=0 MiB=0 BufRegister: n=1 err=0 free=0 MiB=1\n",
	        n_reads, n_posix, read_bytes >> 20);
	fprintf(f, "PER_GPU POOL BUFFER STATS:\n");
	fclose(f);
}

static void log_line(const char *level, const char *msg) {
	const char *path = env("CUFILE_LOGFILE_PATH");
	if (!*path) return;
	FILE *f = fopen(path, "a");
	if (!f) return;
	fprintf(f, " 29-11-2026 18:00:00:000 [pid=%d tid=%d] %s  cufio-standin:1 %s\n", getpid(), gettid(), level, msg);
	fclose(f);
}

// The kernel renders /proc on every read; a file cannot, so the stand-in
// re-renders it on the calls the validator makes before its first snapshot.
static void refresh(void) {
	pthread_mutex_lock(&mu);
	write_nvfs();
	pthread_mutex_unlock(&mu);
}

cferr cuFileDriverOpen(void) {
	cferr e = {0, 0};
	int forced = atoi(env("STANDIN_DRIVER_OPEN_ERR"));
	if (forced) {
		log_line("ERROR", "stand-in driver open failure");
		e.err = forced;
		return e;
	}
	pthread_mutex_lock(&mu);
	nvfs_n = nvfs_ok = atoll(env("STANDIN_NVFS_BASE"));
	n_reads = n_posix = n_nvfs = read_bytes = 0;
	posix_every = atoi(env("STANDIN_POSIX_EVERY"));
	strict = strcmp(env("CUFILE_ALLOW_COMPAT_MODE"), "false") == 0;
	opened = 1;
	write_nvfs();
	pthread_mutex_unlock(&mu);
	if (*env("STANDIN_COMPAT_ONLY")) log_line("NOTICE", "running in compatible mode");
	log_line("INFO", "stand-in driver opened");
	return e;
}
cferr cuFileDriverClose_v2(void) { cferr e = {0, 0}; opened = 0; return e; }
cferr cuFileDriverGetProperties(void *p) {
	cferr e = {0, 0};
	unsigned int *u = p;
	int compat = *env("STANDIN_COMPAT_ONLY") != 0;
	u[0] = opened && !compat ? 2 : 0; // nvfs.major_version
	u[1] = opened && !compat ? 20 : 0;
	return e;
}
cferr cuFileHandleRegister(void **fh, descr *d) {
	cferr e = {0, 0};
	if (d->type != 1) { e.err = 5022; return e; }
	*fh = (void *)(intptr_t)(d->handle.fd + 1);
	refresh();
	return e;
}
void cuFileHandleDeregister(void *fh) { (void)fh; }
cferr cuFileBufRegister(const void *p, size_t n, int flags) {
	(void)p; (void)n; (void)flags;
	cferr e = {0, 0};
	refresh();
	return e;
}
cferr cuFileBufDeregister(const void *p) { (void)p; cferr e = {0, 0}; return e; }

ssize_t cuFileRead(void *fh, void *dev, size_t size, off_t foff, off_t doff) {
	int fd = (int)(intptr_t)fh - 1;
	pthread_mutex_lock(&mu);
	long long k = ++n_reads;
	int posix = posix_every > 0 && k % posix_every == 0;
	pthread_mutex_unlock(&mu);
	if (posix && strict) {
		log_line("ERROR", "cuFileRead direct path failed and compat mode is disabled");
		return -5008;
	}
	ssize_t n = pread(fd, (char *)dev + doff, size, foff);
	if (n < 0) return -1;
	pthread_mutex_lock(&mu);
	read_bytes += n;
	if (posix) {
		n_posix++;
	} else {
		n_nvfs++;
		nvfs_n++;
		nvfs_ok++;
	}
	write_nvfs();
#ifdef STANDIN_NO_STATS_API
	write_gds_stats();
#endif
	pthread_mutex_unlock(&mu);
	if (posix) log_line("NOTICE", "cuFileRead nvfs path unavailable, using cuFile posix read/write with compat mode enabled");
	return n;
}

#ifndef STANDIN_NO_STATS_API
// Layout of cuFile 1.14's CUfileStatsLevel3_t, as the validator's shim
// declares it.
typedef struct { uint64_t ok, err; } opcnt;
typedef struct {
	opcnt read_ops, write_ops, h1, h2, b1, b2;
	uint64_t read_bytes, rest[9];
	opcnt batch[15];
	uint64_t batch_counters[12];
} l1;
typedef struct {
	char uuid[16];
	uint64_t read_bytes, read_bw, read_util, read_dur, n_total_reads, n_p2p_reads, n_nvfs_reads,
	    n_posix_reads, n_unaligned_reads, n_dr_reads, n_sparse, n_inline, n_reads_err;
	uint64_t w[11];
	uint64_t m[5];
} pergpu;
typedef struct {
	l1 basic;
	uint64_t rh[32], wh[32];
	uint32_t num_gpus;
	pergpu g[16];
} l3;

static int level;
cferr cuFileSetStatsLevel(int l) { cferr e = {0, 0}; if (l < 0 || l > 3) e.err = 5022; else level = l; return e; }
cferr cuFileStatsStart(void) { cferr e = {0, 0}; return e; }
cferr cuFileStatsReset(void) {
	cferr e = {0, 0};
	pthread_mutex_lock(&mu);
	n_reads = n_posix = n_nvfs = read_bytes = 0;
	pthread_mutex_unlock(&mu);
	return e;
}
cferr cuFileGetStatsL3(void *out) {
	cferr e = {0, 0};
	if (level < 3) { e.err = 5022; return e; }
	l3 *s = out;
	memset(s, 0, sizeof *s);
	pthread_mutex_lock(&mu);
	s->basic.read_ops.ok = n_reads;
	s->basic.read_bytes = read_bytes;
	s->num_gpus = 1;
	s->g[0].n_total_reads = n_reads;
	s->g[0].n_nvfs_reads = n_nvfs;
	s->g[0].n_posix_reads = n_posix;
	s->g[0].read_bytes = read_bytes;
	pthread_mutex_unlock(&mu);
	return e;
}
#endif
