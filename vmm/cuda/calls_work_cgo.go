//go:build cgo && linux

package cuda

/*
#include "xseg_cuda.h"

// Go pointers passed to these are used during the call only.
#cgo noescape xs_streamCreate
#cgo noescape xs_eventCreate
#cgo noescape xs_memAlloc
#cgo noescape xs_memcpyHtoD
#cgo noescape xs_memcpyDtoH

// Trampolines for streams, events, copies and plain allocations; each runs
// in context c (NULL: any context), see XS_IN_CTX.
static CUresult xs_streamCreate(xs_syms *s, xs_ctx c, uintptr_t *st) { XS_IN_CTX(s, c, s->cuStreamCreate((CUstream *)st, CU_STREAM_NON_BLOCKING)); }
static CUresult xs_streamDestroy(xs_syms *s, xs_ctx c, uintptr_t st) { XS_IN_CTX(s, c, s->cuStreamDestroy((CUstream)st)); }
static CUresult xs_streamSynchronize(xs_syms *s, xs_ctx c, uintptr_t st) { XS_IN_CTX(s, c, s->cuStreamSynchronize((CUstream)st)); }
static CUresult xs_ctxSynchronize(xs_syms *s, xs_ctx c) { XS_IN_CTX(s, c, s->cuCtxSynchronize()); }
static CUresult xs_eventCreate(xs_syms *s, xs_ctx c, uintptr_t *e) { XS_IN_CTX(s, c, s->cuEventCreate((CUevent *)e, CU_EVENT_DISABLE_TIMING)); }
static CUresult xs_eventRecord(xs_syms *s, xs_ctx c, uintptr_t e, uintptr_t st) { XS_IN_CTX(s, c, s->cuEventRecord((CUevent)e, (CUstream)st)); }
static CUresult xs_eventQuery(xs_syms *s, xs_ctx c, uintptr_t e) { XS_IN_CTX(s, c, s->cuEventQuery((CUevent)e)); }
static CUresult xs_eventSynchronize(xs_syms *s, xs_ctx c, uintptr_t e) { XS_IN_CTX(s, c, s->cuEventSynchronize((CUevent)e)); }
static CUresult xs_eventDestroy(xs_syms *s, xs_ctx c, uintptr_t e) { XS_IN_CTX(s, c, s->cuEventDestroy((CUevent)e)); }
static CUresult xs_memAlloc(xs_syms *s, xs_ctx c, CUdeviceptr *p, size_t size) { XS_IN_CTX(s, c, s->cuMemAlloc(p, size)); }
static CUresult xs_memFree(xs_syms *s, xs_ctx c, CUdeviceptr p) { XS_IN_CTX(s, c, s->cuMemFree(p)); }

// Copies and memset are asynchronous for device memory; these wait for the
// context's legacy default stream, where the driver queued them, so that
// the bytes are in place when the call returns (for another process too).
static CUresult xs_sync(xs_syms *s, CUresult r) { return r != CUDA_SUCCESS ? r : s->cuStreamSynchronize(NULL); }
static CUresult xs_memcpyHtoD(xs_syms *s, xs_ctx c, CUdeviceptr d, const void *h, size_t n) { XS_IN_CTX(s, c, xs_sync(s, s->cuMemcpyHtoD(d, h, n))); }
static CUresult xs_memcpyDtoH(xs_syms *s, xs_ctx c, void *h, CUdeviceptr d, size_t n) { XS_IN_CTX(s, c, s->cuMemcpyDtoH(h, d, n)); }
static CUresult xs_memcpyDtoD(xs_syms *s, xs_ctx c, CUdeviceptr dst, CUdeviceptr src, size_t n) { XS_IN_CTX(s, c, xs_sync(s, s->cuMemcpy(dst, src, n))); }
static CUresult xs_memsetD8Async(xs_syms *s, xs_ctx c, CUdeviceptr d, unsigned char v, size_t n, uintptr_t st) { XS_IN_CTX(s, c, s->cuMemsetD8Async(d, v, n, (CUstream)st)); }
static CUresult xs_memsetD8(xs_syms *s, xs_ctx c, CUdeviceptr d, unsigned char v, size_t n) { XS_IN_CTX(s, c, xs_sync(s, s->cuMemsetD8(d, v, n))); }
*/
import "C"

import (
	"unsafe"

	"github.com/xseg-dev/xseg/vmm"
)

// CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags); with CU_STREAM_NON_BLOCKING.
func (t symtab) streamCreate(c cuContext) (vmm.Stream, error) {
	var s C.uintptr_t
	err := result(C.xs_streamCreate(t.p, C.xs_ctx(c), &s))
	return vmm.Stream(s), err
}

// CUresult cuStreamDestroy_v2(CUstream hStream);
func (t symtab) streamDestroy(c cuContext, s vmm.Stream) error {
	return result(C.xs_streamDestroy(t.p, C.xs_ctx(c), C.uintptr_t(s)))
}

// CUresult cuCtxSynchronize(void); in context c.
func (t symtab) ctxSynchronize(c cuContext) error {
	return result(C.xs_ctxSynchronize(t.p, C.xs_ctx(c)))
}

// CUresult cuStreamSynchronize(CUstream hStream);
func (t symtab) streamSynchronize(c cuContext, s vmm.Stream) error {
	return result(C.xs_streamSynchronize(t.p, C.xs_ctx(c), C.uintptr_t(s)))
}

// CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags); with CU_EVENT_DISABLE_TIMING.
func (t symtab) eventCreate(c cuContext) (vmm.Event, error) {
	var e C.uintptr_t
	err := result(C.xs_eventCreate(t.p, C.xs_ctx(c), &e))
	return vmm.Event(e), err
}

// CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
func (t symtab) eventRecord(c cuContext, e vmm.Event, s vmm.Stream) error {
	return result(C.xs_eventRecord(t.p, C.xs_ctx(c), C.uintptr_t(e), C.uintptr_t(s)))
}

// CUresult cuEventQuery(CUevent hEvent); CUDA_ERROR_NOT_READY means "not yet".
func (t symtab) eventQuery(c cuContext, e vmm.Event) (bool, error) {
	r := C.xs_eventQuery(t.p, C.xs_ctx(c), C.uintptr_t(e))
	if r == C.CUDA_ERROR_NOT_READY {
		return false, nil
	}
	return r == 0, result(r)
}

// CUresult cuEventSynchronize(CUevent hEvent);
func (t symtab) eventSynchronize(c cuContext, e vmm.Event) error {
	return result(C.xs_eventSynchronize(t.p, C.xs_ctx(c), C.uintptr_t(e)))
}

// CUresult cuEventDestroy_v2(CUevent hEvent);
func (t symtab) eventDestroy(c cuContext, e vmm.Event) error {
	return result(C.xs_eventDestroy(t.p, C.xs_ctx(c), C.uintptr_t(e)))
}

// CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount); then a sync.
func (t symtab) memcpyHtoD(c cuContext, dst vmm.DevicePtr, src []byte) error {
	return result(C.xs_memcpyHtoD(t.p, C.xs_ctx(c), C.CUdeviceptr(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

// CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
func (t symtab) memcpyDtoH(c cuContext, dst []byte, src vmm.DevicePtr) error {
	return result(C.xs_memcpyDtoH(t.p, C.xs_ctx(c), unsafe.Pointer(&dst[0]), C.CUdeviceptr(src), C.size_t(len(dst))))
}

// CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount); then a sync.
func (t symtab) memcpyDtoD(c cuContext, dst, src vmm.DevicePtr, n uint64) error {
	return result(C.xs_memcpyDtoD(t.p, C.xs_ctx(c), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n)))
}

// CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N); then a sync.
func (t symtab) memsetD8(c cuContext, dst vmm.DevicePtr, v byte, n uint64) error {
	return result(C.xs_memsetD8(t.p, C.xs_ctx(c), C.CUdeviceptr(dst), C.uchar(v), C.size_t(n)))
}

// CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
func (t symtab) memsetD8Async(c cuContext, dst vmm.DevicePtr, v byte, n uint64, s vmm.Stream) error {
	return result(C.xs_memsetD8Async(t.p, C.xs_ctx(c), C.CUdeviceptr(dst), C.uchar(v), C.size_t(n), C.uintptr_t(s)))
}

// CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
func (t symtab) memAlloc(c cuContext, size uint64) (vmm.DevicePtr, error) {
	var p C.CUdeviceptr
	err := result(C.xs_memAlloc(t.p, C.xs_ctx(c), &p, C.size_t(size)))
	return vmm.DevicePtr(p), err
}

// CUresult cuMemFree_v2(CUdeviceptr dptr);
func (t symtab) memFree(c cuContext, p vmm.DevicePtr) error {
	return result(C.xs_memFree(t.p, C.xs_ctx(c), C.CUdeviceptr(p)))
}
