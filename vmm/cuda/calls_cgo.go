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
#cgo noescape xs_memGetAccess

// Trampolines that need no context: device queries and context bookkeeping.
static CUresult xs_driverGetVersion(xs_syms *s, int *v) { return s->cuDriverGetVersion(v); }
static CUresult xs_deviceGetCount(xs_syms *s, int *n) { return s->cuDeviceGetCount(n); }
static CUresult xs_deviceGet(xs_syms *s, CUdevice *d, int ordinal) { return s->cuDeviceGet(d, ordinal); }
static CUresult xs_deviceGetName(xs_syms *s, char *name, int len, CUdevice d) { return s->cuDeviceGetName(name, len, d); }
static CUresult xs_deviceGetUuid(xs_syms *s, CUuuid *u, CUdevice d) { return s->cuDeviceGetUuid(u, d); }
static CUresult xs_deviceTotalMem(xs_syms *s, size_t *n, CUdevice d) { return s->cuDeviceTotalMem(n, d); }
static CUresult xs_deviceGetAttribute(xs_syms *s, int *v, int attr, CUdevice d) { return s->cuDeviceGetAttribute(v, attr, d); }
static CUresult xs_primaryCtxRetain(xs_syms *s, xs_ctx *c, CUdevice d) { return s->cuDevicePrimaryCtxRetain((CUcontext *)c, d); }
static CUresult xs_primaryCtxRelease(xs_syms *s, CUdevice d) { return s->cuDevicePrimaryCtxRelease(d); }
static CUresult xs_ctxGetCurrent(xs_syms *s, xs_ctx *c) { return s->cuCtxGetCurrent((CUcontext *)c); }
static CUresult xs_ctxSetCurrent(xs_syms *s, xs_ctx c) { return s->cuCtxSetCurrent((CUcontext)c); }
static void xs_setFallback(xs_syms *s, xs_ctx c) { s->fallback = (CUcontext)c; }

// Trampolines that run in context c (NULL: any context), see XS_IN_CTX.
static CUresult xs_granularity(xs_syms *s, xs_ctx c, size_t *g, CUdevice d, int option) {
	CUmemAllocationProp p = {0};
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = d;
	XS_IN_CTX(s, c, s->cuMemGetAllocationGranularity(g, &p, option));
}
static CUresult xs_memGetInfo(xs_syms *s, xs_ctx c, size_t *free, size_t *total) { XS_IN_CTX(s, c, s->cuMemGetInfo(free, total)); }
static CUresult xs_memAddressReserve(xs_syms *s, xs_ctx c, CUdeviceptr *p, size_t size, size_t align) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemAddressReserve(p, size, align, 0, 0))); }
static CUresult xs_memAddressFree(xs_syms *s, xs_ctx c, CUdeviceptr p, size_t size) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemAddressFree(p, size))); }
static CUresult xs_memCreate(xs_syms *s, xs_ctx c, CUmemGenericAllocationHandle *h, size_t size, CUdevice d, int types, int rdma) {
	CUmemAllocationProp p = {0};
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requestedHandleTypes = types;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = d;
	p.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
	XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemCreate(h, size, &p, 0)));
}
static CUresult xs_memRelease(xs_syms *s, xs_ctx c, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemRelease(h))); }
static CUresult xs_memMap(xs_syms *s, xs_ctx c, CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemMap(p, size, off, h, 0))); }
static CUresult xs_memUnmap(xs_syms *s, xs_ctx c, CUdeviceptr p, size_t size) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemUnmap(p, size))); }
static CUresult xs_memSetAccess1(xs_syms *s, xs_ctx c, CUdeviceptr p, size_t size, CUdevice d, int flags) {
	CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, d}, flags};
	XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemSetAccess(p, size, &a, 1)));
}
static CUresult xs_memSetAccess(xs_syms *s, xs_ctx c, CUdeviceptr p, size_t size, const CUmemAccessDesc *a, size_t n) { XS_IN_CTX(s, c, XS_RELAXED(s, s->cuMemSetAccess(p, size, a, n))); }
static CUresult xs_memExportFD(xs_syms *s, xs_ctx c, int *fd, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, s->cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)); }
static CUresult xs_memExportFabric(xs_syms *s, xs_ctx c, CUmemFabricHandle *f, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, s->cuMemExportToShareableHandle(f, h, CU_MEM_HANDLE_TYPE_FABRIC, 0)); }
static CUresult xs_memImportFD(xs_syms *s, xs_ctx c, CUmemGenericAllocationHandle *h, int fd) { XS_IN_CTX(s, c, s->cuMemImportFromShareableHandle(h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)); }
static CUresult xs_memImportFabric(xs_syms *s, xs_ctx c, CUmemGenericAllocationHandle *h, CUmemFabricHandle *f) { XS_IN_CTX(s, c, s->cuMemImportFromShareableHandle(h, f, CU_MEM_HANDLE_TYPE_FABRIC)); }
static CUresult xs_memGetAllocationProperties(xs_syms *s, xs_ctx c, CUmemAllocationProp *p, CUmemGenericAllocationHandle h) { XS_IN_CTX(s, c, s->cuMemGetAllocationPropertiesFromHandle(p, h)); }
static CUresult xs_memGetAccess(xs_syms *s, xs_ctx c, unsigned long long *flags, CUdevice d, CUdeviceptr p) {
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, d};
	XS_IN_CTX(s, c, s->cuMemGetAccess(flags, &loc, p));
}
*/
import "C"

import (
	"syscall"
	"unsafe"

	"github.com/xseg-dev/xseg/vmm"
)

// symtab is the symbol table of libcuda, the symbols of a Driver that Open
// made. Its wrappers below each cross into C once, through the trampoline
// of the same name; the C prototype of the driver function sits above each
// wrapper. They convert between Go's types and C's and nothing more. A
// context argument of 0 means that any context will do (see XS_IN_CTX in
// xseg_cuda.h).
type symtab struct{ p *C.xs_syms }

var _ symbols = symtab{}

// The Go constants of symbols.go must be cuda.h's; a difference makes an
// index out of range here and fails the build.
var _ = [1]struct{}{}[attrVMM-C.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED+
	attrPosixFD-C.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED+
	attrRDMAWithVMM-C.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED+
	attrFabric-C.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED]

// setFallback makes c the context of calls that may run in any context,
// on threads that have none.
func (t symtab) setFallback(c cuContext) { C.xs_setFallback(t.p, C.xs_ctx(c)) }

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
func (t symtab) deviceGet(ordinal vmm.Device) (cuDevice, error) {
	var d C.CUdevice
	err := result(C.xs_deviceGet(t.p, &d, C.int(ordinal)))
	return cuDevice(d), err
}

// CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
func (t symtab) deviceGetName(d cuDevice) (string, error) {
	var buf [256]C.char
	if err := result(C.xs_deviceGetName(t.p, &buf[0], C.int(len(buf)), C.CUdevice(d))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
func (t symtab) deviceGetUUID(d cuDevice) ([16]byte, error) {
	var u C.CUuuid
	err := result(C.xs_deviceGetUuid(t.p, &u, C.CUdevice(d)))
	return *(*[16]byte)(unsafe.Pointer(&u.bytes[0])), err
}

// CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
func (t symtab) deviceTotalMem(d cuDevice) (uint64, error) {
	var n C.size_t
	err := result(C.xs_deviceTotalMem(t.p, &n, C.CUdevice(d)))
	return uint64(n), err
}

// CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
func (t symtab) deviceGetAttribute(attr int, d cuDevice) (int, error) {
	var v C.int
	err := result(C.xs_deviceGetAttribute(t.p, &v, C.int(attr), C.CUdevice(d)))
	return int(v), err
}

// CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
func (t symtab) primaryCtxRetain(d cuDevice) (cuContext, error) {
	var c C.xs_ctx
	err := result(C.xs_primaryCtxRetain(t.p, &c, C.CUdevice(d)))
	return cuContext(c), err
}

// CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
func (t symtab) primaryCtxRelease(d cuDevice) error {
	return result(C.xs_primaryCtxRelease(t.p, C.CUdevice(d)))
}

// CUresult cuCtxGetCurrent(CUcontext *pctx);
func (t symtab) ctxGetCurrent() (cuContext, error) {
	var c C.xs_ctx
	err := result(C.xs_ctxGetCurrent(t.p, &c))
	return cuContext(c), err
}

// CUresult cuCtxSetCurrent(CUcontext ctx);
func (t symtab) ctxSetCurrent(c cuContext) error {
	return result(C.xs_ctxSetCurrent(t.p, C.xs_ctx(c)))
}

// CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option);
func (t symtab) granularity(c cuContext, d cuDevice, recommended bool) (uint64, error) {
	var g C.size_t
	opt := C.int(C.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
	if recommended {
		opt = C.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
	}
	err := result(C.xs_granularity(t.p, C.xs_ctx(c), &g, C.CUdevice(d), opt))
	return uint64(g), err
}

// CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
func (t symtab) memGetInfo(c cuContext) (free, total uint64, err error) {
	var f, tot C.size_t
	err = result(C.xs_memGetInfo(t.p, C.xs_ctx(c), &f, &tot))
	return uint64(f), uint64(tot), err
}

// CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
func (t symtab) memAddressReserve(c cuContext, size, align uint64) (vmm.DevicePtr, error) {
	var p C.CUdeviceptr
	err := result(C.xs_memAddressReserve(t.p, C.xs_ctx(c), &p, C.size_t(size), C.size_t(align)))
	return vmm.DevicePtr(p), err
}

// CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
func (t symtab) memAddressFree(c cuContext, ptr vmm.DevicePtr, size uint64) error {
	return result(C.xs_memAddressFree(t.p, C.xs_ctx(c), C.CUdeviceptr(ptr), C.size_t(size)))
}

// CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
func (t symtab) memCreate(c cuContext, size uint64, d cuDevice, types vmm.HandleType, rdma bool) (vmm.Handle, error) {
	var h C.CUmemGenericAllocationHandle
	r := 0
	if rdma {
		r = 1
	}
	err := result(C.xs_memCreate(t.p, C.xs_ctx(c), &h, C.size_t(size), C.CUdevice(d), C.int(types), C.int(r)))
	return vmm.Handle(h), err
}

// CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
func (t symtab) memRelease(c cuContext, h vmm.Handle) error {
	return result(C.xs_memRelease(t.p, C.xs_ctx(c), C.CUmemGenericAllocationHandle(h)))
}

// CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags);
func (t symtab) memMap(c cuContext, ptr vmm.DevicePtr, size, offset uint64, h vmm.Handle) error {
	return result(C.xs_memMap(t.p, C.xs_ctx(c), C.CUdeviceptr(ptr), C.size_t(size), C.size_t(offset), C.CUmemGenericAllocationHandle(h)))
}

// CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
func (t symtab) memUnmap(c cuContext, ptr vmm.DevicePtr, size uint64) error {
	return result(C.xs_memUnmap(t.p, C.xs_ctx(c), C.CUdeviceptr(ptr), C.size_t(size)))
}

// CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
func (t symtab) memSetAccess(c cuContext, ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) error {
	if len(access) == 1 {
		a := access[0]
		return result(C.xs_memSetAccess1(t.p, C.xs_ctx(c), C.CUdeviceptr(ptr), C.size_t(size), C.CUdevice(a.Device), C.int(a.Flags)))
	}
	descs := make([]C.CUmemAccessDesc, len(access))
	for i, a := range access {
		descs[i].location._type = C.CU_MEM_LOCATION_TYPE_DEVICE
		descs[i].location.id = C.int(a.Device)
		descs[i].flags = C.int(a.Flags)
	}
	return result(C.xs_memSetAccess(t.p, C.xs_ctx(c), C.CUdeviceptr(ptr), C.size_t(size), &descs[0], C.size_t(len(descs))))
}

// CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType, unsigned long long flags);
// with handleType CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; the fd is then made close-on-exec.
func (t symtab) memExportFD(c cuContext, h vmm.Handle) (int, error) {
	fd := C.int(-1)
	if err := result(C.xs_memExportFD(t.p, C.xs_ctx(c), &fd, C.CUmemGenericAllocationHandle(h))); err != nil {
		return -1, err
	}
	syscall.CloseOnExec(int(fd))
	return int(fd), nil
}

// CUresult cuMemExportToShareableHandle(...) with handleType CU_MEM_HANDLE_TYPE_FABRIC.
func (t symtab) memExportFabric(c cuContext, h vmm.Handle) (vmm.FabricHandle, error) {
	var f C.CUmemFabricHandle
	err := result(C.xs_memExportFabric(t.p, C.xs_ctx(c), &f, C.CUmemGenericAllocationHandle(h)))
	return *(*vmm.FabricHandle)(unsafe.Pointer(&f.data[0])), err
}

// CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle, CUmemAllocationHandleType shHandleType);
// with the fd itself as osHandle.
func (t symtab) memImportFD(c cuContext, fd int) (vmm.Handle, error) {
	var h C.CUmemGenericAllocationHandle
	err := result(C.xs_memImportFD(t.p, C.xs_ctx(c), &h, C.int(fd)))
	return vmm.Handle(h), err
}

// CUresult cuMemImportFromShareableHandle(...) with a CUmemFabricHandle* as osHandle.
func (t symtab) memImportFabric(c cuContext, fh vmm.FabricHandle) (vmm.Handle, error) {
	var h C.CUmemGenericAllocationHandle
	var f C.CUmemFabricHandle
	*(*vmm.FabricHandle)(unsafe.Pointer(&f.data[0])) = fh
	err := result(C.xs_memImportFabric(t.p, C.xs_ctx(c), &h, &f))
	return vmm.Handle(h), err
}

// CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle);
func (t symtab) memAllocationProperties(c cuContext, h vmm.Handle) (vmm.Device, vmm.HandleType, error) {
	var p C.CUmemAllocationProp
	err := result(C.xs_memGetAllocationProperties(t.p, C.xs_ctx(c), &p, C.CUmemGenericAllocationHandle(h)))
	return vmm.Device(p.location.id), vmm.HandleType(p.requestedHandleTypes), err
}

// CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr);
// for the device location d.
func (t symtab) memGetAccess(c cuContext, d cuDevice, ptr vmm.DevicePtr) (vmm.Access, error) {
	var flags C.ulonglong
	err := result(C.xs_memGetAccess(t.p, C.xs_ctx(c), &flags, C.CUdevice(d), C.CUdeviceptr(ptr)))
	return vmm.Access(flags), err
}
