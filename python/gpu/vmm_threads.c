// Do the CUDA driver's VMM calls scale with threads? Times cuMemCreate,
// cuMemRelease, cuMemMap, cuMemSetAccess and cuMemUnmap of N pages of
// 2 MiB (POSIX-fd exportable, as xseg's shareable pages), one call a page,
// on one thread and spread over T = 1, 2, 4, 8 threads, two passes, and
// prints the wall time per page in us (bench/RESULTS.md round 22). No CUDA
// headers needed; on the GPU machine:
//   gcc -O2 -o /tmp/vmm_threads python/gpu/vmm_threads.c -ldl -lpthread && /tmp/vmm_threads
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef unsigned long long u64;
// CUmemAllocationProp and CUmemAccessDesc, as the driver API lays them out.
typedef struct {
	int type, requested_handle_types;
	struct { int type, id; } location;
	void* win32_meta;
	unsigned char compression, rdma;
	unsigned short usage;
	unsigned char reserved[4];
} prop_t;
typedef struct {
	struct { int type, id; } location;
	int flags;
} access_t;

static int (*cu_init)(unsigned);
static int (*cu_device_get)(int*, int);
static int (*cu_retain)(void**, int);
static int (*cu_set_current)(void*);
static int (*cu_create)(u64*, size_t, const prop_t*, u64);
static int (*cu_release)(u64);
static int (*cu_reserve)(u64*, size_t, size_t, u64, u64);
static int (*cu_map)(u64, size_t, size_t, u64, u64);
static int (*cu_set_access)(u64, size_t, const access_t*, size_t);
static int (*cu_unmap)(u64, size_t);

enum { CREATE, RELEASE, MAP, ACCESS, UNMAP };
static const size_t page = 2 << 20;
static const int n = 1024;
static void* ctx;
static prop_t prop;
static u64* handles;
static u64 base;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct { int lo, hi, op; } job_t;

static void* work(void* arg) {
	job_t* j = arg;
	cu_set_current(ctx);
	for (int i = j->lo; i < j->hi; i++) {
		u64 at = base + (u64)i * page;
		access_t rw = {{1, 0}, 3}; // device 0, read-write
		int rc = 0;
		switch (j->op) {
		case CREATE: rc = cu_create(&handles[i], page, &prop, 0); break;
		case RELEASE: rc = cu_release(handles[i]); break;
		case MAP: rc = cu_map(at, page, 0, handles[i], 0); break;
		case ACCESS: rc = cu_set_access(at, page, &rw, 1); break;
		case UNMAP: rc = cu_unmap(at, page); break;
		}
		if (rc) {
			fprintf(stderr, "op %d on page %d: CUresult %d\n", j->op, i, rc);
			exit(1);
		}
	}
	return NULL;
}

// run does op on every page from threads threads and returns us a page.
static double run(int op, int threads) {
	pthread_t th[8];
	job_t jobs[8];
	double t0 = now();
	for (int t = 0; t < threads; t++) {
		jobs[t] = (job_t){n * t / threads, n * (t + 1) / threads, op};
		pthread_create(&th[t], NULL, work, &jobs[t]);
	}
	for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
	return (now() - t0) * 1e6 / n;
}

static void* sym(void* lib, const char* name) {
	void* p = dlsym(lib, name);
	if (!p) {
		fprintf(stderr, "dlsym %s: %s\n", name, dlerror());
		exit(1);
	}
	return p;
}

int main(void) {
	void* cu = dlopen("libcuda.so.1", RTLD_NOW);
	if (!cu) {
		fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
		return 1;
	}
	*(void**)&cu_init = sym(cu, "cuInit");
	*(void**)&cu_device_get = sym(cu, "cuDeviceGet");
	*(void**)&cu_retain = sym(cu, "cuDevicePrimaryCtxRetain");
	*(void**)&cu_set_current = sym(cu, "cuCtxSetCurrent");
	*(void**)&cu_create = sym(cu, "cuMemCreate");
	*(void**)&cu_release = sym(cu, "cuMemRelease");
	*(void**)&cu_reserve = sym(cu, "cuMemAddressReserve");
	*(void**)&cu_map = sym(cu, "cuMemMap");
	*(void**)&cu_set_access = sym(cu, "cuMemSetAccess");
	*(void**)&cu_unmap = sym(cu, "cuMemUnmap");
	int dev;
	if (cu_init(0) || cu_device_get(&dev, 0) || cu_retain(&ctx, dev) || cu_set_current(ctx)) {
		fprintf(stderr, "no CUDA context\n");
		return 1;
	}
	memset(&prop, 0, sizeof prop);
	prop.type = 1;                   // pinned
	prop.location.type = 1;          // device
	prop.requested_handle_types = 1; // POSIX fd
	handles = calloc(n, sizeof *handles);
	if (!handles || cu_reserve(&base, (size_t)n * page, 0, 0, 0)) {
		fprintf(stderr, "reserving %d pages failed\n", n);
		return 1;
	}
	const int counts[] = {1, 2, 4, 8};
	for (int pass = 0; pass < 2; pass++) {
		for (int k = 0; k < 4; k++) {
			int t = counts[k];
			// Each line: the op over t threads, then over one thread.
			double create = run(CREATE, t), map1 = run(MAP, 1), access1 = run(ACCESS, 1), unmap1 = run(UNMAP, 1),
			       release = run(RELEASE, t);
			double create1 = run(CREATE, 1), map = run(MAP, t), access = run(ACCESS, t), unmap = run(UNMAP, t),
			       release1 = run(RELEASE, 1);
			printf("threads %d, us a page (t threads / one): create %.2f / %.2f, release %.2f / %.2f, map %.2f / %.2f, "
			       "set access %.2f / %.2f, unmap %.2f / %.2f\n",
			       t, create, create1, release, release1, map, map1, access, access1, unmap, unmap1);
		}
	}
	return 0;
}
