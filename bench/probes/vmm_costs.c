// vmm_costs.c: what the CUDA driver charges for mapping, granting and unmapping
// a run of pages, straight from C (bench/RESULTS.md, round 30). It needs the
// CUDA toolkit's cuda.h and a GPU; on the GPU machine, from the repository
// root:
//
//   gcc -O2 -I/usr/local/cuda/include bench/probes/vmm_costs.c -o /tmp/vmm_costs -lcuda && /tmp/vmm_costs
//
// Each line is a median or a single cycle, in microseconds; CK prints any
// call that fails (the "cutting unmap" is meant to). Nothing in the module
// builds or needs it.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s; cuGetErrorString(r_, &s); printf("%s -> %d %s\n", #x, r_, s); } } while (0)
// WRAPPED makes call as vmm/cuda makes a driver call, as wrap says: bit 1
// sets the thread's capture mode relaxed around it (XS_RELAXED), bit 2
// pushes ctx before it and pops it after (xs_enter on a thread without a
// current context).
#define WRAPPED(wrap, ctx, call) do { \
    CUcontext old_; CUstreamCaptureMode m_ = CU_STREAM_CAPTURE_MODE_RELAXED; \
    if ((wrap) & 2) CK(cuCtxPushCurrent(ctx)); \
    if ((wrap) & 1) CK(cuThreadExchangeStreamCaptureMode(&m_)); \
    CK(call); \
    if ((wrap) & 1) CK(cuThreadExchangeStreamCaptureMode(&m_)); \
    if ((wrap) & 2) CK(cuCtxPopCurrent(&old_)); \
  } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static int cmpd(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
int main(void) {
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = {0}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
  size_t ps = 2 << 20; enum { N = 64, R = 15 };
  CUdeviceptr base; CK(cuMemAddressReserve(&base, N * ps, 0, 0, 0));
  CUmemGenericAllocationHandle h[N]; for (int i = 0; i < N; i++) CK(cuMemCreate(&h[i], ps, &prop, 0));
  CUmemAccessDesc acc = {0}; acc.location = prop.location; acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  int runs[] = {1, 4, 16, 64};
  for (int ri = 0; ri < 4; ri++) {
    int run = runs[ri]; double per[R], one[R], mapt[R], acct[R];
    for (int rep = 0; rep < R; rep++) {
      for (int mode = 0; mode < 2; mode++) {
        double t0 = now();
        for (int i = 0; i < N; i++) CK(cuMemMap(base + i * ps, ps, 0, h[i], 0));
        double t1 = now();
        for (int i = 0; i < N; i += run) CK(cuMemSetAccess(base + i * ps, run * ps, &acc, 1));
        double t2 = now();
        CK(cuMemsetD8(base, 1, N * ps)); CK(cuCtxSynchronize());
        double t3 = now();
        if (mode == 0) { for (int i = 0; i < N; i++) CK(cuMemUnmap(base + i * ps, ps)); }
        else { for (int i = 0; i < N; i += run) CK(cuMemUnmap(base + i * ps, run * ps)); }
        double t4 = now();
        if (mode == 0) { per[rep] = (t4 - t3) / N; mapt[rep] = (t1 - t0) / N; acct[rep] = (t2 - t1) / (N / run); }
        else one[rep] = (t4 - t3) / N;
      }
    }
    qsort(per, R, sizeof(double), cmpd); qsort(one, R, sizeof(double), cmpd); qsort(mapt, R, sizeof(double), cmpd); qsort(acct, R, sizeof(double), cmpd);
    printf("run %2d pages: unmap per page (one call a page) %.2f us; unmap per page (one call a run) %.2f us; map %.2f us/page; setaccess %.2f us/call\n", run, per[R/2], one[R/2], mapt[R/2], acct[R/2]);
  }
  // Does a single unmap over a run also work when the run is a mix of pages and a multi-page allocation?
  CUmemGenericAllocationHandle big; CK(cuMemCreate(&big, 4 * ps, &prop, 0));
  CK(cuMemMap(base, ps, 0, h[0], 0)); CK(cuMemMap(base + ps, 4 * ps, 0, big, 0)); CK(cuMemMap(base + 5 * ps, ps, 0, h[1], 0));
  CK(cuMemSetAccess(base, 6 * ps, &acc, 1));
  printf("mixed run unmap in one call:\n"); CK(cuMemUnmap(base, 6 * ps));
  // A range that cuts a mapping: must fail.
  CK(cuMemMap(base, 4 * ps, 0, big, 0)); printf("cutting unmap (expect error):\n"); CK(cuMemUnmap(base, 2 * ps)); CK(cuMemUnmap(base, 4 * ps));
  // A range that covers a hole (unmapped page in the middle): 
  CK(cuMemMap(base, ps, 0, h[0], 0)); CK(cuMemMap(base + 2 * ps, ps, 0, h[1], 0)); printf("unmap over a hole:\n"); CK(cuMemUnmap(base, 3 * ps));
  CK(cuMemUnmap(base, ps)); CK(cuMemUnmap(base + 2 * ps, ps));
  // Create vs create big, release
  double t0 = now(); CUmemGenericAllocationHandle hh[N]; for (int i = 0; i < N; i++) CK(cuMemCreate(&hh[i], ps, &prop, 0)); double t1 = now();
  for (int i = 0; i < N; i++) CK(cuMemRelease(hh[i]));
  double t2 = now();
  printf("create %.2f us/page, release %.2f us/page\n", (t1 - t0) / N, (t2 - t1) / N);
  // One 128 MiB allocation (one mapping) against 64 pages: map, first grant, re-grant, unmap.
  CUmemGenericAllocationHandle ch; CK(cuMemCreate(&ch, N * ps, &prop, 0));
  for (int rep = 0; rep < 3; rep++) {
    double a = now(); CK(cuMemMap(base, N * ps, 0, ch, 0)); double b = now(); CK(cuMemSetAccess(base, N * ps, &acc, 1)); double c = now();
    CK(cuMemSetAccess(base, N * ps, &acc, 1)); double d = now(); CK(cuMemUnmap(base, N * ps)); double e = now();
    printf("one 128 MiB mapping: map %.1f us, first grant %.1f us, re-grant %.1f us, unmap %.1f us\n", b - a, c - b, d - c, e - d);
    a = now(); for (int i = 0; i < N; i++) CK(cuMemMap(base + i * ps, ps, 0, h[i], 0)); b = now(); CK(cuMemSetAccess(base, N * ps, &acc, 1)); c = now();
    CK(cuMemSetAccess(base, N * ps, &acc, 1)); d = now(); CK(cuMemUnmap(base, N * ps)); e = now();
    printf("64 mappings of 2 MiB: map %.1f us, first grant %.1f us, re-grant %.1f us, unmap (one call) %.1f us\n", b - a, c - b, d - c, e - d);
  }
  // Run64's sequence from C, no GPU work between: map 64, grant, re-grant, unmap (one call).
  for (int rep = 0; rep < 5; rep++) {
    double a = now(); for (int i = 0; i < N; i++) CK(cuMemMap(base + i * ps, ps, 0, h[i], 0)); double b = now();
    CK(cuMemSetAccess(base, N * ps, &acc, 1)); double c = now(); CK(cuMemSetAccess(base, N * ps, &acc, 1)); double d = now();
    CK(cuMemUnmap(base, N * ps)); double e = now();
    printf("Run64 from C: map %.1f us, first grant %.1f us, re-grant %.1f us, unmap %.1f us\n", b - a, c - b, d - c, e - d);
  }
  // The same maps and unmaps, each wrapped as vmm/cuda wraps a call: the
  // thread's capture mode set relaxed and back, and the context pushed and
  // popped (a Go thread seldom has it current).
  for (int wrap = 0; wrap <= 3; wrap++) {
    double mt[R], ut[R];
    for (int rep = 0; rep < R; rep++) {
      if (wrap & 2) CK(cuCtxSetCurrent(NULL));
      double a = now();
      for (int i = 0; i < N; i++) WRAPPED(wrap, ctx, cuMemMap(base + i * ps, ps, 0, h[i], 0));
      double b = now();
      if (wrap & 2) CK(cuCtxPushCurrent(ctx));
      CK(cuMemSetAccess(base, N * ps, &acc, 1));
      if (wrap & 2) CK(cuCtxPopCurrent(NULL));
      double c = now();
      for (int i = 0; i < N; i++) WRAPPED(wrap, ctx, cuMemUnmap(base + i * ps, ps));
      double e = now();
      mt[rep] = (b - a) / N; ut[rep] = (e - c) / N;
      if (wrap & 2) CK(cuCtxSetCurrent(ctx));
    }
    qsort(mt, R, sizeof(double), cmpd); qsort(ut, R, sizeof(double), cmpd);
    printf("wrapped (%s%s%s): map %.2f us/page, unmap %.2f us/page\n", wrap ? "" : "nothing", wrap & 1 ? "capture mode" : "", wrap & 2 ? " context push/pop" : "", mt[R/2], ut[R/2]);
  }
  // Run64's sequence on pages made with other properties: GPUDirect RDMA
  // capable (vmm/cuda asks for it where the device supports it, as PyTorch
  // does), exportable as a file descriptor, both.
  for (int kind = 0; kind < 4; kind++) {
    CUmemAllocationProp q = prop;
    q.allocFlags.gpuDirectRDMACapable = kind & 1;
    q.requestedHandleTypes = (kind & 2) ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    CUmemGenericAllocationHandle k[N];
    CUresult cr = CUDA_SUCCESS;
    for (int i = 0; i < N && cr == CUDA_SUCCESS; i++) cr = cuMemCreate(&k[i], ps, &q, 0);
    if (cr != CUDA_SUCCESS) { printf("pages%s%s: create refused (%d)\n", kind & 1 ? " rdma" : "", kind & 2 ? " fd" : "", cr); continue; }
    double mt[5], gt[5], ut[5];
    for (int rep = 0; rep < 5; rep++) {
      double a = now(); for (int i = 0; i < N; i++) CK(cuMemMap(base + i * ps, ps, 0, k[i], 0)); double b = now();
      CK(cuMemSetAccess(base, N * ps, &acc, 1)); double c = now();
      for (int i = 0; i < N; i++) CK(cuMemUnmap(base + i * ps, ps));
      double e = now();
      mt[rep] = (b - a) / N; gt[rep] = (c - b) / N; ut[rep] = (e - c) / N;
    }
    qsort(mt, 5, sizeof(double), cmpd); qsort(gt, 5, sizeof(double), cmpd); qsort(ut, 5, sizeof(double), cmpd);
    printf("pages%s%s%s: map %.2f, first grant %.2f, unmap %.2f us/page (medians of 5)\n", kind ? "" : " plain", kind & 1 ? " rdma" : "", kind & 2 ? " fd" : "", mt[2], gt[2], ut[2]);
    for (int i = 0; i < N; i++) CK(cuMemRelease(k[i]));
  }
  printf("done\n");
  return 0;
}
