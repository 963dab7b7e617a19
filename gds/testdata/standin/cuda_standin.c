// Test-only stand-in for libcuda.so.1: "device memory" is host memory, so
// the validator's accounting can be driven on a machine without a GPU.
//
// STANDIN_CUDA_DEVICES: number of devices (default 1); 0 makes cuInit fail
// with CUDA_ERROR_NO_DEVICE (100), like a host with a driver but no GPU.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

static int ndev(void) {
	const char *s = getenv("STANDIN_CUDA_DEVICES");
	return (s && *s) ? atoi(s) : 1;
}

int cuInit(unsigned int flags) { (void)flags; return ndev() > 0 ? 0 : 100; }
int cuDeviceGetCount(int *n) { *n = ndev(); return 0; }
int cuDeviceGet(int *dev, int ordinal) {
	if (ordinal < 0 || ordinal >= ndev()) return 101; // CUDA_ERROR_INVALID_DEVICE
	*dev = ordinal;
	return 0;
}
int cuDeviceGetName(char *buf, int len, int dev) { snprintf(buf, len, "Stand-in GPU %d", dev); return 0; }
int cuGetErrorName(int code, const char **s) {
	switch (code) {
	case 0: *s = "CUDA_SUCCESS"; return 0;
	case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
	case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
	case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
	}
	return 1;
}
static char ctx_token;
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &ctx_token; return 0; }
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
int cuCtxSetCurrent(void *ctx) { return ctx == &ctx_token ? 0 : 201; } // CUDA_ERROR_INVALID_CONTEXT
int cuMemAlloc_v2(uint64_t *p, size_t n) {
	void *m = NULL;
	if (posix_memalign(&m, 4096, n) != 0) return 2;
	memset(m, 0xee, n);
	*p = (uint64_t)(uintptr_t)m;
	return 0;
}
int cuMemFree_v2(uint64_t p) { free((void *)(uintptr_t)p); return 0; }
int cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
	(void)flags;
	return posix_memalign(p, 4096, n) == 0 ? 0 : 2;
}
int cuMemFreeHost(void *p) { free(p); return 0; }
int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return 0; }
int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
