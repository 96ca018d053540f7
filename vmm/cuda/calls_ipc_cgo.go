//go:build cgo && linux

package cuda

/*
#include "xseg_cuda.h"

typedef CUipcMemHandle xs_ipc_handle; // 64 opaque bytes

enum { CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1 }; // CUipcMem_flags

// Go pointers passed to these are used during the call only.
#cgo noescape xs_ipcGetMemHandle
#cgo noescape xs_ipcOpenMemHandle
#cgo noescape xs_memGetAddressRange

// Trampolines of CUDA's legacy IPC; each runs in context c (NULL: any
// context), see XS_IN_CTX.
static CUresult xs_ipcGetMemHandle(xs_syms *s, xs_ctx c, xs_ipc_handle *h, CUdeviceptr p) { XS_IN_CTX(s, c, s->cuIpcGetMemHandle(h, p)); }
static CUresult xs_ipcOpenMemHandle(xs_syms *s, xs_ctx c, CUdeviceptr *p, const xs_ipc_handle *h) { XS_IN_CTX(s, c, s->cuIpcOpenMemHandle(p, *h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)); }
static CUresult xs_ipcCloseMemHandle(xs_syms *s, xs_ctx c, CUdeviceptr p) { XS_IN_CTX(s, c, s->cuIpcCloseMemHandle(p)); }
static CUresult xs_memGetAddressRange(xs_syms *s, xs_ctx c, CUdeviceptr *base, size_t *size, CUdeviceptr p) { XS_IN_CTX(s, c, s->cuMemGetAddressRange(base, size, p)); }
*/
import "C"

import (
	"unsafe"

	"github.com/xseg-dev/xseg/vmm"
)

// CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
func (t symtab) ipcGetMemHandle(c cuContext, p vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	var h C.xs_ipc_handle
	err := result(C.xs_ipcGetMemHandle(t.p, C.xs_ctx(c), &h, C.CUdeviceptr(p)))
	return *(*vmm.IPCMemHandle)(unsafe.Pointer(&h)), err
}

// CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
// with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
func (t symtab) ipcOpenMemHandle(c cuContext, h vmm.IPCMemHandle) (vmm.DevicePtr, error) {
	var p C.CUdeviceptr
	ch := *(*C.xs_ipc_handle)(unsafe.Pointer(&h))
	err := result(C.xs_ipcOpenMemHandle(t.p, C.xs_ctx(c), &p, &ch))
	return vmm.DevicePtr(p), err
}

// CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
func (t symtab) ipcCloseMemHandle(c cuContext, p vmm.DevicePtr) error {
	return result(C.xs_ipcCloseMemHandle(t.p, C.xs_ctx(c), C.CUdeviceptr(p)))
}

// CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
func (t symtab) memGetAddressRange(c cuContext, p vmm.DevicePtr) (vmm.DevicePtr, uint64, error) {
	var base C.CUdeviceptr
	var size C.size_t
	err := result(C.xs_memGetAddressRange(t.p, C.xs_ctx(c), &base, &size, C.CUdeviceptr(p)))
	return vmm.DevicePtr(base), uint64(size), err
}
