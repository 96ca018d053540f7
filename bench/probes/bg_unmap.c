// bg_unmap.c: would unmapping moved pages on a second thread take that cost
// off the allocating thread? (bench/RESULTS.md, round 37). A moved page is
// mapped at its new address and granted there while it is still mapped at
// the old one, which is unmapped later (xseg's retired pages). This probe
// times the allocating thread's side of such moves, with launches between
// them, when it unmaps the old addresses itself and when another thread
// does. It needs the CUDA toolkit's cuda.h and a GPU; on the GPU machine,
// from the repository root:
//
//   gcc -O2 -pthread -I/usr/local/cuda/include bench/probes/bg_unmap.c -o /tmp/bg_unmap -lcuda && /tmp/bg_unmap
//
// With any argument its pages are not GPUDirect RDMA capable (vmm/cuda asks
// for that where the device supports it).
//
// Times are microseconds, medians of R rounds. CK prints any call that fails.
// Nothing in the module builds or needs it.
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s; cuGetErrorString(r_, &s); printf("%s -> %d %s (mode %d, move %d)\n", #x, r_, s, cur_mode, cur_it); exit(1); } } while (0)

enum { P = 8, SLOTS = 32, ITERS = 64, LAUNCHES = 40, R = 9 };
static const size_t ps = 2 << 20;
static CUcontext ctx;
static CUdeviceptr base, scratch;
static CUmemAccessDesc acc;
static CUmemGenericAllocationHandle h[P];
// The slots handed to the unmapper, and how far it has got.
static _Atomic int queued, done, quit;
static int cur_mode, cur_it; // for CK's message

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmpd(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
static CUdeviceptr slot(int i) { return base + (size_t)(i % SLOTS) * P * ps; }
static void unmap_slot(int i) { for (int k = 0; k < P; k++) CK(cuMemUnmap(slot(i) + k * ps, ps)); }

// other: map, grant and unmap pages of its own (g) in a reservation of its
// own, until quit, counting the calls that fail.
static CUmemGenericAllocationHandle g[P];
static CUdeviceptr obase;
static _Atomic int ofail, ocycles;
static void *other(void *arg) {
  (void)arg;
  CK(cuCtxSetCurrent(ctx));
  while (!atomic_load(&quit)) {
    for (int k = 0; k < P; k++) if (cuMemMap(obase + k * ps, ps, 0, g[k], 0) != CUDA_SUCCESS) atomic_fetch_add(&ofail, 1);
    if (cuMemSetAccess(obase, P * ps, &acc, 1) != CUDA_SUCCESS) atomic_fetch_add(&ofail, 1);
    for (int k = 0; k < P; k++) if (cuMemUnmap(obase + k * ps, ps) != CUDA_SUCCESS) atomic_fetch_add(&ofail, 1);
    atomic_fetch_add(&ocycles, 1);
  }
  return NULL;
}

static void *unmapper(void *arg) {
  (void)arg;
  CK(cuCtxSetCurrent(ctx));
  for (;;) {
    int d = atomic_load(&done);
    if (d < atomic_load(&queued)) { unmap_slot(d); atomic_store(&done, d + 1); continue; }
    if (atomic_load(&quit)) return NULL;
  }
}

// round runs ITERS moves of P pages, each after LAUNCHES small async
// memsets on stream s; mode 0: no moves (launches only), 1: the old slot
// unmapped at once by this thread, 2: by the unmapper thread. It returns
// this thread's wall time per move.
static double round_(int mode, CUstream s) {
  int cur = 0;
  cur_mode = mode;
  for (int k = 0; k < P; k++) CK(cuMemMap(slot(cur) + k * ps, ps, 0, h[k], 0));
  CK(cuMemSetAccess(slot(cur), P * ps, &acc, 1));
  atomic_store(&queued, 0); atomic_store(&done, 0);
  double t0 = now();
  for (int it = 1; it <= ITERS; it++) {
    cur_it = it;
    for (int l = 0; l < LAUNCHES; l++) CK(cuMemsetD8Async(scratch + (l % 64) * 4096, (unsigned char)l, 4096, s));
    if (mode == 0) continue;
    // The next slot must be free of the move before last.
    while (mode == 2 && atomic_load(&done) < it - (SLOTS - 2)) {}
    for (int k = 0; k < P; k++) CK(cuMemMap(slot(it) + k * ps, ps, 0, h[k], 0));
    CK(cuMemSetAccess(slot(it), P * ps, &acc, 1));
    if (mode == 1) unmap_slot(it - 1);
    else atomic_store(&queued, it);
  }
  double t = (now() - t0) / ITERS;
  if (mode == 2) while (atomic_load(&done) < ITERS) {}
  CK(cuStreamSynchronize(s));
  if (mode != 0) unmap_slot(ITERS); else unmap_slot(0);
  return t;
}

int main(int argc, char **argv) {
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {0}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
  int rdma = 0; CK(cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev));
  if (argc > 1) rdma = 0; // any argument: plain pages
  prop.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0; // as vmm/cuda makes its pages
  acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemAddressReserve(&base, (size_t)SLOTS * P * ps, 0, 0, 0));
  for (int k = 0; k < P; k++) CK(cuMemCreate(&h[k], ps, &prop, 0));
  CK(cuMemAlloc(&scratch, 64 * 4096));
  CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  // Both threads at once on pages of their own: does either call fail?
  CK(cuMemAddressReserve(&obase, P * ps, 0, 0, 0));
  for (int k = 0; k < P; k++) CK(cuMemCreate(&g[k], ps, &prop, 0));
  pthread_t th; pthread_create(&th, NULL, other, NULL);
  double t3[R];
  for (int r = 0; r < R; r++) t3[r] = round_(1, s);
  atomic_store(&quit, 1); pthread_join(th, NULL);
  qsort(t3, R, sizeof(double), cmpd);
  printf("moves unmapped by this thread while another maps and unmaps pages of its own: %.1f us a move; the other thread: %d cycles, %d failed calls\n", t3[R / 2], atomic_load(&ocycles), atomic_load(&ofail));
  atomic_store(&quit, 0);
  pthread_create(&th, NULL, unmapper, NULL);
  double t[3][R];
  for (int r = 0; r < R; r++)
    for (int m = 0; m < 3; m++) t[m][r] = round_(m, s);
  atomic_store(&quit, 1); pthread_join(th, NULL);
  const char *name[3] = {"launches only", "moves, unmapped by this thread", "moves, unmapped by another thread"};
  printf("%d pages a move, %d memsets before each, RDMA-capable pages %d; us per move on the allocating thread, median of %d (min, max):\n", P, LAUNCHES, rdma, R);
  for (int m = 0; m < 3; m++) {
    qsort(t[m], R, sizeof(double), cmpd);
    printf("  %-36s %8.1f (%.1f, %.1f)\n", name[m], t[m][R / 2], t[m][0], t[m][R - 1]);
  }
  return 0;
}
