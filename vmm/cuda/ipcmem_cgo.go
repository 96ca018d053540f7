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
static CUresult xs_ipcGetMemHandle(xs_syms *s, CUcontext c, xs_ipc_handle *h, CUdeviceptr p) { XS_IN_CTX(s, c, s->cuIpcGetMemHandle(h, p)); }
static CUresult xs_ipcOpenMemHandle(xs_syms *s, CUcontext c, CUdeviceptr *p, const xs_ipc_handle *h) { XS_IN_CTX(s, c, s->cuIpcOpenMemHandle(p, *h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)); }
static CUresult xs_ipcCloseMemHandle(xs_syms *s, CUcontext c, CUdeviceptr p) { XS_IN_CTX(s, c, s->cuIpcCloseMemHandle(p)); }
static CUresult xs_memGetAddressRange(xs_syms *s, CUcontext c, CUdeviceptr *base, size_t *size, CUdeviceptr p) { XS_IN_CTX(s, c, s->cuMemGetAddressRange(base, size, p)); }
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/xseg-dev/xseg/vmm"
)

// CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
func (t symtab) ipcGetMemHandle(c C.CUcontext, p vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	var h C.xs_ipc_handle
	err := result(C.xs_ipcGetMemHandle(t.p, c, &h, C.CUdeviceptr(p)))
	return *(*vmm.IPCMemHandle)(unsafe.Pointer(&h)), err
}

// CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
// with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
func (t symtab) ipcOpenMemHandle(c C.CUcontext, h vmm.IPCMemHandle) (vmm.DevicePtr, error) {
	var p C.CUdeviceptr
	ch := *(*C.xs_ipc_handle)(unsafe.Pointer(&h))
	err := result(C.xs_ipcOpenMemHandle(t.p, c, &p, &ch))
	return vmm.DevicePtr(p), err
}

// CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
func (t symtab) ipcCloseMemHandle(c C.CUcontext, p vmm.DevicePtr) error {
	return result(C.xs_ipcCloseMemHandle(t.p, c, C.CUdeviceptr(p)))
}

// CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
func (t symtab) memGetAddressRange(c C.CUcontext, p vmm.DevicePtr) (vmm.DevicePtr, uint64, error) {
	var base C.CUdeviceptr
	var size C.size_t
	err := result(C.xs_memGetAddressRange(t.p, c, &base, &size, C.CUdeviceptr(p)))
	return vmm.DevicePtr(base), uint64(size), err
}

// ExportAllocIPC returns the legacy IPC handle (cuIpcGetMemHandle) of the
// plain allocation that starts at ptr, which MemAlloc returned (else
// vmm.ErrInvalid). The handle names the whole allocation; the allocation
// stays this process's, and MemFree frees it as usual (importers that
// still have it open keep their mapping until they close it).
func (d *Driver) ExportAllocIPC(ptr vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	if err := d.live(); err != nil {
		return vmm.IPCMemHandle{}, err
	}
	if _, err := d.books.Alloc("exporting the allocation at", ptr); err != nil {
		return vmm.IPCMemHandle{}, err
	}
	h, err := d.sym.ipcGetMemHandle(nil, ptr)
	if err != nil {
		return vmm.IPCMemHandle{}, fmt.Errorf("cuIpcGetMemHandle of the allocation at %v: %w", ptr, err)
	}
	return h, nil
}

// OpenAllocIPC opens the allocation of another process that h names in
// dev's primary context (cuIpcOpenMemHandle, peer access enabled lazily)
// and returns its base and size (cuMemGetAddressRange). The CUDA driver
// refuses a handle exported by this very process (typically
// CUDA_ERROR_INVALID_CONTEXT) and, depending on its version, a handle
// already open here; a second open that the driver answers with an
// address already in the books is undone and refused with vmm.ErrInUse.
// Usage counts the open until CloseAllocIPC.
func (d *Driver) OpenAllocIPC(h vmm.IPCMemHandle, dev vmm.Device) (vmm.DevicePtr, uint64, error) {
	if err := d.live(); err != nil {
		return 0, 0, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, 0, err
	}
	if h == (vmm.IPCMemHandle{}) {
		return 0, 0, fmt.Errorf("opening an IPC handle: all zero: %w", vmm.ErrInvalid)
	}
	p, err := d.sym.ipcOpenMemHandle(s.ctx, h)
	if err != nil {
		return 0, 0, fmt.Errorf("cuIpcOpenMemHandle on device %d: %w", dev, err)
	}
	base, size, err := d.sym.memGetAddressRange(s.ctx, p)
	if err == nil && base != p {
		err = fmt.Errorf("the opened allocation starts at %v, not at %v: %w", base, p, vmm.ErrInvalid)
	}
	if err == nil {
		err = d.books.AddIPCOpen(p, size)
	}
	if err != nil {
		return 0, 0, errors.Join(fmt.Errorf("opening an IPC handle on device %d at %v: %w", dev, p, err),
			d.sym.ipcCloseMemHandle(s.ctx, p))
	}
	return p, size, nil
}

// CloseAllocIPC closes an allocation opened by OpenAllocIPC
// (cuIpcCloseMemHandle); any other pointer is vmm.ErrInvalid. If the
// driver fails, the allocation stays open.
func (d *Driver) CloseAllocIPC(ptr vmm.DevicePtr) error {
	if err := d.live(); err != nil {
		return err
	}
	size, err := d.books.BeginCloseIPC(ptr)
	if err != nil {
		return err
	}
	if err := d.sym.ipcCloseMemHandle(nil, ptr); err != nil {
		d.books.UndoCloseIPC(ptr, size)
		return fmt.Errorf("cuIpcCloseMemHandle %v: %w", ptr, err)
	}
	return nil
}

// ExportAllocFD is vmm.ErrNotSupported: CUDA shares plain allocations
// through legacy IPC (ExportAllocIPC), not as file descriptors.
func (d *Driver) ExportAllocFD(ptr vmm.DevicePtr) (int, uint64, error) {
	if err := d.live(); err != nil {
		return -1, 0, err
	}
	return -1, 0, fmt.Errorf("exporting the allocation at %v as an fd: CUDA shares plain allocations through legacy IPC (ExportAllocIPC): %w", ptr, vmm.ErrNotSupported)
}
