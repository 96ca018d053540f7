// Cost of a warm xseg_malloc / xseg_free pair from C, measured as
// torch_latency.cpp (beside it) measures PyTorch's caching allocator: the
// same seven sizes, one warm-up round, then 200000 rounds of each loop on
// the default stream of device 0. Loops:
//   single  allocate one block and free it at once, the sizes in turn
//   batch   allocate one block of each size, then free them all
// Build and run on the GPU machine (no CUDA headers needed):
//   gcc -O2 -o latency python/gpu/latency.c -ldl && ./latency .gpu-lib/libxseg.so
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

typedef int (*cuInit_t)(unsigned);
typedef int (*cuDeviceGet_t)(int*, int);
typedef int (*cuDevicePrimaryCtxRetain_t)(void**, int);
typedef int (*cuCtxSetCurrent_t)(void*);
typedef void* (*xmalloc_t)(ssize_t, int, void*);
typedef void (*xfree_t)(void*, ssize_t, int, void*);
typedef char* (*xstats_t)(int);
typedef void (*xstrfree_t)(char*);
typedef const char* (*xerr_t)(void);

static void* sym(void* h, const char* name) {
	void* p = dlsym(h, name);
	if (!p) {
		fprintf(stderr, "dlsym %s: %s\n", name, dlerror());
		exit(1);
	}
	return p;
}

static void cuda_context(void) {
	void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!cu) {
		fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
		exit(1);
	}
	int dev, rc;
	void* ctx;
	if ((rc = ((cuInit_t)sym(cu, "cuInit"))(0)) ||
	    (rc = ((cuDeviceGet_t)sym(cu, "cuDeviceGet"))(&dev, 0)) ||
	    (rc = ((cuDevicePrimaryCtxRetain_t)sym(cu, "cuDevicePrimaryCtxRetain"))(&ctx, dev)) ||
	    (rc = ((cuCtxSetCurrent_t)sym(cu, "cuCtxSetCurrent"))(ctx))) {
		fprintf(stderr, "making a CUDA context current: CUresult %d\n", rc);
		exit(1);
	}
}

int main(int argc, char** argv) {
	const char* path = argc > 1 ? argv[1] : ".gpu-lib/libxseg.so";
	cuda_context();
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
		return 1;
	}
	xmalloc_t xmalloc = (xmalloc_t)sym(h, "xseg_malloc");
	xfree_t xfree = (xfree_t)sym(h, "xseg_free");
	xerr_t xerr = (xerr_t)sym(h, "xseg_last_error");
	xstats_t xstats = (xstats_t)sym(h, "xseg_stats_json");
	xstrfree_t xstrfree = (xstrfree_t)sym(h, "xseg_string_free");

	const size_t sizes[] = {512, 4096, 65536, 1 << 20, 3 << 20, 24 << 20, 100 << 20};
	enum { K = sizeof sizes / sizeof sizes[0] };
	void* ps[K];
	for (int j = 0; j < K; j++) {  // warm the cache
		void* p = xmalloc((ssize_t)sizes[j], 0, NULL);
		if (!p) {
			fprintf(stderr, "xseg_malloc(%zu): %s\n", sizes[j], xerr());
			return 1;
		}
		xfree(p, (ssize_t)sizes[j], 0, NULL);
	}
	const int N = 200000;
	long failed_single = 0, failed_batch = 0;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < N; i++) {
		for (int j = 0; j < K; j++) {
			void* p = xmalloc((ssize_t)sizes[j], 0, NULL);
			failed_single += p == NULL;
			xfree(p, (ssize_t)sizes[j], 0, NULL);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double single = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / ((double)N * K);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < N; i++) {
		for (int j = 0; j < K; j++) ps[j] = xmalloc((ssize_t)sizes[j], 0, NULL);
		for (int j = 0; j < K; j++) {
			failed_batch += ps[j] == NULL;
			xfree(ps[j], (ssize_t)sizes[j], 0, NULL);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double batch = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / ((double)N * K);
	printf("xseg single malloc+free pair: %.1f ns (%ld failed)\n", single, failed_single);
	printf("xseg cached malloc+free pair: %.1f ns (%ld failed)\n", batch, failed_batch);
	char* js = xstats(0);
	if (js) {
		printf("xseg stats: %.400s\n", js);
		xstrfree(js);
	}
	return failed_single + failed_batch != 0;
}
