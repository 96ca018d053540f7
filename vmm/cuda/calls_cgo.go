//go:build cgo && linux

package cuda

/*
#include "xseg_cuda.h"

// Go pointers passed to these are used during the call only.
#cgo noescape xs_driverGetVersion
#cgo noescape xs_deviceGetCount
#cgo noescape xs_deviceGet
#cgo noescape xs_deviceGetName
#cgo noescape xs_deviceGetUuid
#cgo noescape xs_deviceTotalMem
#cgo noescape xs_deviceGetAttribute
#cgo noescape xs_granularity
#cgo noescape xs_memGetInfo
#cgo noescape xs_memAddressReserve
#cgo noescape xs_memCreate
#cgo noescape xs_memSetAccess
#cgo noescape xs_memExportFD
#cgo noescape xs_memExportFabric
#cgo noescape xs_memImportFD
#cgo noescape xs_memImportFabric
#cgo noescape xs_memGetAllocationProperties

// Trampolines that need no context: device queries and context bookkeeping.
static CUresult xs_driverGetVersion(xs_syms *s, int *v) { return s->cuDriverGetVersion(v); }
static CUresult xs_deviceGetCount(xs_syms *s, int *n) { return s->cuDeviceGetCount(n); }
static CUresult xs_deviceGet(xs_syms *s, CUdevice *d, int ordinal) { return s->cuDeviceGet(d, ordinal); }
static CUresult xs_deviceGetName(xs_syms *s, char *name, int len, CUdevice d) { return s->cuDeviceGetName(name, len, d); }
static CUresult xs_deviceGetUuid(xs_syms *s, CUuuid *u, CUdevice d) { return s->cuDeviceGetUuid(u, d); }
static CUresult xs_deviceTotalMem(xs_syms *s, size_t *n, CUdevice d) { return s->cuDeviceTotalMem(n, d); }
static CUresult xs_deviceGetAttribute(xs_syms *s, int *v, int attr, CUdevice d) { return s->cuDeviceGetAttribute(v, attr, d); }
static CUresult xs_primaryCtxRetain(xs_syms *s, CUcontext *c, CUdevice d) { return s->cuDevicePrimaryCtxRetain(c, d); }
static CUresult xs_primaryCtxRelease(xs_syms *s, CUdevice d) { return s->cuDevicePrimaryCtxRelease(d); }
static CUresult xs_ctxGetCurrent(xs_syms *s, CUcontext *c) { return s->cuCtxGetCurrent(c); }
static CUresult xs_ctxSetCurrent(xs_syms *s, CUcontext c) { return s->cuCtxSetCurrent(c); }

// Trampolines that run in context c (NULL: any context), see XS_IN_CTX.
static CUresult xs_granularity(xs_syms *s, CUcontext c, size_t *g, CUdevice d, int option) {
	CUmemAllocationProp p = {0};
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = d;
	XS_IN_CTX(s, c, s->cuMemGetAllocationGranularity(g, &p, option));
}
static CUresult xs_memGetInfo(xs_syms *s, CUcontext c, size_t *free, size_t *total) { XS_IN_CTX(s, c, s->cuMemGetInfo(free, total)); }
static CUresult xs_memAddressReserve(xs_syms *s, CUcontext c, CUdeviceptr *p, size_t size, size_t align) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemAddressReserve(p, size, align, 0, 0))); }
static CUresult xs_memAddressFree(xs_syms *s, CUcontext c, CUdeviceptr p, size_t size) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemAddressFree(p, size))); }
static CUresult xs_memCreate(xs_syms *s, CUcontext c, CUmemGenericAllocationHandle *h, size_t size, CUdevice d, int types, int rdma) {
	CUmemAllocationProp p = {0};
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requestedHandleTypes = types;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = d;
	p.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
	XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemCreate(h, size, &p, 0)));
}
static CUresult xs_memRelease(xs_syms *s, CUcontext c, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemRelease(h))); }
static CUresult xs_memMap(xs_syms *s, CUcontext c, CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemMap(p, size, off, h, 0))); }
static CUresult xs_memUnmap(xs_syms *s, CUcontext c, CUdeviceptr p, size_t size) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemUnmap(p, size))); }
static CUresult xs_memSetAccess1(xs_syms *s, CUcontext c, CUdeviceptr p, size_t size, CUdevice d, int flags) {
	CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, d}, flags};
	XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemSetAccess(p, size, &a, 1)));
}
static CUresult xs_memSetAccess(xs_syms *s, CUcontext c, CUdeviceptr p, size_t size, const CUmemAccessDesc *a, size_t n) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemSetAccess(p, size, a, n))); }
static CUresult xs_memExportFD(xs_syms *s, CUcontext c, int *fd, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, s->cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)); }
static CUresult xs_memExportFabric(xs_syms *s, CUcontext c, CUmemFabricHandle *f, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, s->cuMemExportToShareableHandle(f, h, CU_MEM_HANDLE_TYPE_FABRIC, 0)); }
static CUresult xs_memImportFD(xs_syms *s, CUcontext c, CUmemGenericAllocationHandle *h, int fd) { XS_IN_CTX(s, c, s->cuMemImportFromShareableHandle(h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)); }
static CUresult xs_memImportFabric(xs_syms *s, CUcontext c, CUmemGenericAllocationHandle *h, CUmemFabricHandle *f) { XS_IN_CTX(s, c, s->cuMemImportFromShareableHandle(h, f, CU_MEM_HANDLE_TYPE_FABRIC)); }
static CUresult xs_memGetAllocationProperties(xs_syms *s, CUcontext c, CUmemAllocationProp *p, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, s->cuMemGetAllocationPropertiesFromHandle(p, h)); }
*/
import "C"

import (
	"unsafe"

	"github.com/xseg-dev/xseg/vmm"
)

// symtab is a Driver's symbol table. Its wrappers below each cross into C
// once, through the trampoline of the same name; the C prototype of the
// driver function sits above each wrapper. A nil context argument means
// that any context will do (see XS_IN_CTX in xseg_cuda.h).
type symtab struct{ p *C.xs_syms }

func result(r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return Result(r)
}

// CUresult cuDriverGetVersion(int *driverVersion);
func (t symtab) driverGetVersion() (int, error) {
	var v C.int
	err := result(C.xs_driverGetVersion(t.p, &v))
	return int(v), err
}

// CUresult cuDeviceGetCount(int *count);
func (t symtab) deviceGetCount() (int, error) {
	var n C.int
	err := result(C.xs_deviceGetCount(t.p, &n))
	return int(n), err
}

// CUresult cuDeviceGet(CUdevice *device, int ordinal);
func (t symtab) deviceGet(ordinal vmm.Device) (C.CUdevice, error) {
	var d C.CUdevice
	err := result(C.xs_deviceGet(t.p, &d, C.int(ordinal)))
	return d, err
}

// CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
func (t symtab) deviceGetName(d C.CUdevice) (string, error) {
	var buf [256]C.char
	if err := result(C.xs_deviceGetName(t.p, &buf[0], C.int(len(buf)), d)); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
func (t symtab) deviceGetUUID(d C.CUdevice) ([16]byte, error) {
	var u C.CUuuid
	err := result(C.xs_deviceGetUuid(t.p, &u, d))
	return *(*[16]byte)(unsafe.Pointer(&u.bytes[0])), err
}

// CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
func (t symtab) deviceTotalMem(d C.CUdevice) (uint64, error) {
	var n C.size_t
	err := result(C.xs_deviceTotalMem(t.p, &n, d))
	return uint64(n), err
}

// CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
func (t symtab) deviceGetAttribute(attr C.int, d C.CUdevice) (int, error) {
	var v C.int
	err := result(C.xs_deviceGetAttribute(t.p, &v, attr, d))
	return int(v), err
}

// CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
func (t symtab) primaryCtxRetain(d C.CUdevice) (C.CUcontext, error) {
	var c C.CUcontext
	err := result(C.xs_primaryCtxRetain(t.p, &c, d))
	return c, err
}

// CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
func (t symtab) primaryCtxRelease(d C.CUdevice) error {
	return result(C.xs_primaryCtxRelease(t.p, d))
}

// CUresult cuCtxGetCurrent(CUcontext *pctx);
func (t symtab) ctxGetCurrent() (C.CUcontext, error) {
	var c C.CUcontext
	err := result(C.xs_ctxGetCurrent(t.p, &c))
	return c, err
}

// CUresult cuCtxSetCurrent(CUcontext ctx);
func (t symtab) ctxSetCurrent(c C.CUcontext) error {
	return result(C.xs_ctxSetCurrent(t.p, c))
}

// CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option);
func (t symtab) granularity(c C.CUcontext, d C.CUdevice, recommended bool) (uint64, error) {
	var g C.size_t
	opt := C.int(C.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
	if recommended {
		opt = C.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
	}
	err := result(C.xs_granularity(t.p, c, &g, d, opt))
	return uint64(g), err
}

// CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
func (t symtab) memGetInfo(c C.CUcontext) (free, total uint64, err error) {
	var f, tot C.size_t
	err = result(C.xs_memGetInfo(t.p, c, &f, &tot))
	return uint64(f), uint64(tot), err
}

// CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
func (t symtab) memAddressReserve(c C.CUcontext, size, align uint64) (vmm.DevicePtr, error) {
	var p C.CUdeviceptr
	err := result(C.xs_memAddressReserve(t.p, c, &p, C.size_t(size), C.size_t(align)))
	return vmm.DevicePtr(p), err
}

// CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
func (t symtab) memAddressFree(c C.CUcontext, ptr vmm.DevicePtr, size uint64) error {
	return result(C.xs_memAddressFree(t.p, c, C.CUdeviceptr(ptr), C.size_t(size)))
}

// CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
func (t symtab) memCreate(c C.CUcontext, size uint64, d C.CUdevice, types vmm.HandleType, rdma bool) (vmm.Handle, error) {
	var h C.CUmemGenericAllocationHandle
	r := 0
	if rdma {
		r = 1
	}
	err := result(C.xs_memCreate(t.p, c, &h, C.size_t(size), d, C.int(types), C.int(r)))
	return vmm.Handle(h), err
}

// CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
func (t symtab) memRelease(c C.CUcontext, h vmm.Handle) error {
	return result(C.xs_memRelease(t.p, c, C.CUmemGenericAllocationHandle(h)))
}

// CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags);
func (t symtab) memMap(c C.CUcontext, ptr vmm.DevicePtr, size, offset uint64, h vmm.Handle) error {
	return result(C.xs_memMap(t.p, c, C.CUdeviceptr(ptr), C.size_t(size), C.size_t(offset), C.CUmemGenericAllocationHandle(h)))
}

// CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
func (t symtab) memUnmap(c C.CUcontext, ptr vmm.DevicePtr, size uint64) error {
	return result(C.xs_memUnmap(t.p, c, C.CUdeviceptr(ptr), C.size_t(size)))
}

// CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
func (t symtab) memSetAccess(c C.CUcontext, ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) error {
	if len(access) == 1 {
		a := access[0]
		return result(C.xs_memSetAccess1(t.p, c, C.CUdeviceptr(ptr), C.size_t(size), C.CUdevice(a.Device), C.int(a.Flags)))
	}
	descs := make([]C.CUmemAccessDesc, len(access))
	for i, a := range access {
		descs[i].location._type = C.CU_MEM_LOCATION_TYPE_DEVICE
		descs[i].location.id = C.int(a.Device)
		descs[i].flags = C.int(a.Flags)
	}
	return result(C.xs_memSetAccess(t.p, c, C.CUdeviceptr(ptr), C.size_t(size), &descs[0], C.size_t(len(descs))))
}

// CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType, unsigned long long flags);
// with handleType CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
func (t symtab) memExportFD(c C.CUcontext, h vmm.Handle) (int, error) {
	fd := C.int(-1)
	err := result(C.xs_memExportFD(t.p, c, &fd, C.CUmemGenericAllocationHandle(h)))
	return int(fd), err
}

// CUresult cuMemExportToShareableHandle(...) with handleType CU_MEM_HANDLE_TYPE_FABRIC.
func (t symtab) memExportFabric(c C.CUcontext, h vmm.Handle) (vmm.FabricHandle, error) {
	var f C.CUmemFabricHandle
	err := result(C.xs_memExportFabric(t.p, c, &f, C.CUmemGenericAllocationHandle(h)))
	return *(*vmm.FabricHandle)(unsafe.Pointer(&f.data[0])), err
}

// CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle, CUmemAllocationHandleType shHandleType);
// with the fd itself as osHandle.
func (t symtab) memImportFD(c C.CUcontext, fd int) (vmm.Handle, error) {
	var h C.CUmemGenericAllocationHandle
	err := result(C.xs_memImportFD(t.p, c, &h, C.int(fd)))
	return vmm.Handle(h), err
}

// CUresult cuMemImportFromShareableHandle(...) with a CUmemFabricHandle* as osHandle.
func (t symtab) memImportFabric(c C.CUcontext, fh vmm.FabricHandle) (vmm.Handle, error) {
	var h C.CUmemGenericAllocationHandle
	var f C.CUmemFabricHandle
	*(*vmm.FabricHandle)(unsafe.Pointer(&f.data[0])) = fh
	err := result(C.xs_memImportFabric(t.p, c, &h, &f))
	return vmm.Handle(h), err
}

// CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle);
func (t symtab) memAllocationProperties(c C.CUcontext, h vmm.Handle) (vmm.Device, vmm.HandleType, error) {
	var p C.CUmemAllocationProp
	err := result(C.xs_memGetAllocationProperties(t.p, c, &p, C.CUmemGenericAllocationHandle(h)))
	return vmm.Device(p.location.id), vmm.HandleType(p.requestedHandleTypes), err
}
