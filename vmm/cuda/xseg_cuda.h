// xseg_cuda.h: the few types, constants and entry points of the CUDA driver
// API that package cuda uses. The build has no cuda.h, so they are declared
// here; every value and layout was checked against cuda.h of CUDA 12.6
// (CUDA_VERSION 12060). The _Static_asserts pin the struct layouts.
//
// Entry points are reached through a symbol table (xs_syms) filled once by
// cuGetProcAddress, and called through the static inline trampolines at the
// end of this file, one per entry point.

#ifndef XSEG_CUDA_H
#define XSEG_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct { unsigned char bytes[16]; } CUuuid;

// xs_ctx is a CUcontext as Go holds it (cuContext, a uintptr): the
// trampolines take contexts as xs_ctx, so that Go passes no pointer.
typedef uintptr_t xs_ctx;
_Static_assert(sizeof(xs_ctx) == sizeof(CUcontext), "xs_ctx holds a CUcontext");

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_NOT_READY = 600,
};

// CUdevice_attribute values.
enum {
	CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
	CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128,
};

enum {
	CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,      // CUmemAllocationType
	CU_MEM_LOCATION_TYPE_DEVICE = 0x1,        // CUmemLocationType
	CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1, // CUmemAllocationHandleType
	CU_MEM_HANDLE_TYPE_FABRIC = 0x8,
	CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,   // CUmemAllocationGranularity_flags
	CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1,
	CU_STREAM_NON_BLOCKING = 0x1,             // CUstream_flags
	CU_EVENT_DISABLE_TIMING = 0x2,            // CUevent_flags
	CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0, // CUdriverProcAddress_flags
	CU_GET_PROC_ADDRESS_SUCCESS = 0,          // CUdriverProcAddressQueryResult
	CU_STREAM_CAPTURE_MODE_RELAXED = 2,       // CUstreamCaptureMode
};

typedef struct {
	int type; // CUmemLocationType
	int id;
} CUmemLocation;

typedef struct {
	int type;                 // CUmemAllocationType
	int requestedHandleTypes; // CUmemAllocationHandleType
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct {
	CUmemLocation location;
	int flags; // CUmemAccess_flags
} CUmemAccessDesc;

typedef struct { unsigned char data[64]; } CUmemFabricHandle;
typedef struct { char reserved[64]; } CUipcMemHandle;

_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation layout");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "CUmemAllocationProp.win32HandleMetaData");
_Static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "CUmemAllocationProp.allocFlags");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout");
_Static_assert(sizeof(CUmemFabricHandle) == 64, "CUmemFabricHandle layout");
_Static_assert(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle layout");

// The loader's own entry points, found with dlsym.
typedef CUresult (*xs_getproc_v2)(const char *symbol, void **pfn, int cudaVersion, uint64_t flags, int *symbolStatus);
typedef CUresult (*xs_getproc_v1)(const char *symbol, void **pfn, int cudaVersion, uint64_t flags);
typedef CUresult (*xs_init_fn)(unsigned int flags);
typedef CUresult (*xs_version_fn)(int *version);

// XS_ENTRY_POINTS lists every entry point of the symbol table: its name as
// cuGetProcAddress knows it (the base name; the version asked for picks the
// _v2 variants) and its parameters.
#define XS_ENTRY_POINTS(X) \
	X(cuInit, (unsigned int flags)) \
	X(cuDriverGetVersion, (int *version)) \
	X(cuGetErrorName, (CUresult error, const char **str)) \
	X(cuGetErrorString, (CUresult error, const char **str)) \
	X(cuDeviceGet, (CUdevice *device, int ordinal)) \
	X(cuDeviceGetCount, (int *count)) \
	X(cuDeviceGetName, (char *name, int len, CUdevice dev)) \
	X(cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev)) \
	X(cuDeviceTotalMem, (size_t *bytes, CUdevice dev)) \
	X(cuDeviceGetAttribute, (int *pi, int attrib, CUdevice dev)) \
	X(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev)) \
	X(cuDevicePrimaryCtxRelease, (CUdevice dev)) \
	X(cuCtxGetCurrent, (CUcontext *pctx)) \
	X(cuCtxSetCurrent, (CUcontext ctx)) \
	X(cuCtxPushCurrent, (CUcontext ctx)) \
	X(cuCtxPopCurrent, (CUcontext *pctx)) \
	X(cuCtxGetDevice, (CUdevice *device)) \
	X(cuCtxSynchronize, (void)) \
	X(cuThreadExchangeStreamCaptureMode, (int *mode)) \
	X(cuMemGetInfo, (size_t *free, size_t *total)) \
	X(cuMemGetAllocationGranularity, (size_t *granularity, const CUmemAllocationProp *prop, int option)) \
	X(cuMemAddressReserve, (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) \
	X(cuMemAddressFree, (CUdeviceptr ptr, size_t size)) \
	X(cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)) \
	X(cuMemRelease, (CUmemGenericAllocationHandle handle)) \
	X(cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
	X(cuMemUnmap, (CUdeviceptr ptr, size_t size)) \
	X(cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)) \
	X(cuMemExportToShareableHandle, (void *shareableHandle, CUmemGenericAllocationHandle handle, int handleType, unsigned long long flags)) \
	X(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *handle, void *osHandle, int shHandleType)) \
	X(cuMemGetAllocationPropertiesFromHandle, (CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)) \
	X(cuStreamCreate, (CUstream *phStream, unsigned int flags)) \
	X(cuStreamDestroy, (CUstream hStream)) \
	X(cuStreamSynchronize, (CUstream hStream)) \
	X(cuEventCreate, (CUevent *phEvent, unsigned int flags)) \
	X(cuEventRecord, (CUevent hEvent, CUstream hStream)) \
	X(cuEventQuery, (CUevent hEvent)) \
	X(cuEventSynchronize, (CUevent hEvent)) \
	X(cuEventDestroy, (CUevent hEvent)) \
	X(cuMemcpyHtoD, (CUdeviceptr dst, const void *src, size_t n)) \
	X(cuMemcpyDtoH, (void *dst, CUdeviceptr src, size_t n)) \
	X(cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t n)) \
	X(cuMemsetD8, (CUdeviceptr dst, unsigned char uc, size_t n)) \
	X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char uc, size_t n, CUstream hStream)) \
	X(cuMemAlloc, (CUdeviceptr *dptr, size_t bytesize)) \
	X(cuMemFree, (CUdeviceptr dptr)) \
	X(cuMemGetAccess, (unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)) \
	/* Legacy IPC of plain allocations (ipcmem_cgo.go). */ \
	X(cuIpcGetMemHandle, (CUipcMemHandle *pHandle, CUdeviceptr dptr)) \
	X(cuIpcOpenMemHandle, (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)) \
	X(cuIpcCloseMemHandle, (CUdeviceptr dptr)) \
	X(cuMemGetAddressRange, (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr))

#define XS_FIELD(name, params) CUresult (*name) params;
#define XS_NAME(name, params) #name,
#define XS_COUNT(name, params) +1

// xs_syms is the symbol table of one Driver: every entry point, resolved
// once, and the context a call falls back on when it may run in any context
// and the calling thread has none. The timing fields are written only in
// builds with XS_TIMING (see timing_tag_cgo.go).
typedef struct {
	XS_ENTRY_POINTS(XS_FIELD)
	CUcontext fallback;
	uint64_t timed_calls;      // XS_TIMING: ns spent in the driver calls
	uint64_t timed_trampolines; // XS_TIMING: ns spent in whole trampolines
} xs_syms;

enum { XS_NUM_ENTRY_POINTS = 0 XS_ENTRY_POINTS(XS_COUNT) };

// xs_enter makes a context fit for a call current on the calling thread.
// want is the context the call needs; NULL means any context will do (the
// thread's, or s->fallback if it has none). When the thread's current
// context already fits, nothing changes, so a caller that made the
// device's context current (PyTorch's threads) pays one cuCtxGetCurrent.
// Otherwise the context is pushed, and *pushed set for xs_leave to pop it
// after the call, leaving the thread as it was.
//
// Leaving the context current on a thread that had none would save the
// push and pop (35-50 ns on an H200 host: BenchmarkEventQuery, none minus
// current), but a primary context released by Close then appears to live
// on, with the device's file descriptors, while it is current on some
// thread (the conformance suite's fd check saw a second GPU's descriptors
// outlive Close), and Close cannot reach other threads.
static inline CUresult xs_enter(xs_syms *s, CUcontext want, int *pushed) {
	CUcontext cur = NULL, w = want ? want : s->fallback;
	*pushed = 0;
	CUresult r = s->cuCtxGetCurrent(&cur);
	if (r != CUDA_SUCCESS || cur == w || (!want && cur != NULL)) return r;
	if ((r = s->cuCtxPushCurrent(w)) == CUDA_SUCCESS) *pushed = 1;
	return r;
}

// xs_leave pops what xs_enter pushed and returns the call's result r, or
// the pop's error if the call succeeded and the pop did not.
static inline CUresult xs_leave(xs_syms *s, CUresult r) {
	CUcontext popped;
	CUresult p = s->cuCtxPopCurrent(&popped);
	return r != CUDA_SUCCESS ? r : p;
}

#ifdef XS_TIMING
#include <time.h>
static inline uint64_t xs_clock(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#define XS_STAMP(v) uint64_t v = xs_clock()
#define XS_ADD(field, t0) ((field) += xs_clock() - (t0))
#else
#define XS_STAMP(v) do {} while (0)
#define XS_ADD(field, t0) do {} while (0)
#endif

// XS_IN_CTX runs call with a context fit for it current (see xs_enter) and
// returns its result. want is a CUcontext or an xs_ctx. One cgo crossing runs all of it on one OS thread.
#define XS_IN_CTX(s, want, call) do { \
	XS_STAMP(t0_); \
	int pushed_; \
	CUresult r_ = xs_enter((s), (CUcontext)(want), &pushed_); \
	if (r_ == CUDA_SUCCESS) { \
		XS_STAMP(t1_); \
		r_ = (call); \
		XS_ADD((s)->timed_calls, t1_); \
		if (pushed_) r_ = xs_leave((s), r_); \
	} \
	XS_ADD((s)->timed_trampolines, t0_); \
	return r_; \
} while (0)

// XS_RELAXED runs call with the calling thread's stream-capture mode set to
// relaxed, then puts the thread's mode back. A CUDA graph capture in the
// global or thread-local mode forbids "potentially unsafe" calls while it
// runs; creating, mapping and unmapping pages is legal in a capture (its
// addresses stay valid for the graph's replays), as PyTorch's cudaMalloc
// during capture is, so the VMM calls run relaxed, as PyTorch runs its
// own allocations. Outside a capture the mode changes nothing.
#define XS_RELAXED(s, call) ({ \
	int mode_ = CU_STREAM_CAPTURE_MODE_RELAXED; \
	CUresult x_ = (s)->cuThreadExchangeStreamCaptureMode(&mode_); \
	if (x_ == CUDA_SUCCESS) { \
		x_ = (call); \
		(s)->cuThreadExchangeStreamCaptureMode(&mode_); \
	} \
	x_; \
})

#endif
