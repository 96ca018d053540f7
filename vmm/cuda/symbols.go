package cuda

import "github.com/xseg-dev/xseg/vmm"

// cuContext is a CUcontext, a driver's context handle; 0 is no context
// (CUcontext NULL). Passed to a call of the symbol table, 0 means that any
// context will do: the calling thread's, or the fallback context if the
// thread has none (see XS_IN_CTX in xseg_cuda.h).
type cuContext uintptr

// cuDevice is a CUdevice, the driver's handle of a device.
type cuDevice int32

// The CUdevice_attribute values the Driver reads (cuda.h; xseg_cuda.h
// declares the same, and lib_cgo.go checks that they agree).
const (
	attrVMM         = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	attrPosixFD     = 103 // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
	attrRDMAWithVMM = 110 // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
	attrFabric      = 128 // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
)

// symbols is the symbol table of a Driver: the entry points of the CUDA
// driver API it calls, over Go types. Everything of the Driver above it
// (contexts to pick, the books, error wrapping, undo on failure) is plain
// Go; the table of libcuda (symtab, calls_cgo.go) is the only
// implementation that crosses into C, one crossing a method, and the tests
// drive the Driver over an in-Go fake of it.
//
// Each method is one driver call (named in its comment). A failure is a
// Result; success is a nil error. A method taking a context runs the call
// in it, or in any context for 0, leaving the calling thread's current
// context as it found it. No method keeps a slice it is given.
type symbols interface {
	deviceGetCount() (int, error)                                          // cuDeviceGetCount
	deviceGet(ordinal vmm.Device) (cuDevice, error)                        // cuDeviceGet
	deviceGetName(d cuDevice) (string, error)                              // cuDeviceGetName
	deviceGetUUID(d cuDevice) ([16]byte, error)                            // cuDeviceGetUuid_v2
	deviceTotalMem(d cuDevice) (uint64, error)                             // cuDeviceTotalMem_v2
	deviceGetAttribute(attr int, d cuDevice) (int, error)                  // cuDeviceGetAttribute
	primaryCtxRetain(d cuDevice) (cuContext, error)                        // cuDevicePrimaryCtxRetain
	primaryCtxRelease(d cuDevice) error                                    // cuDevicePrimaryCtxRelease_v2
	setFallback(c cuContext)                                               // the context of calls that may run in any, where the thread has none
	granularity(c cuContext, d cuDevice, recommended bool) (uint64, error) // cuMemGetAllocationGranularity of a pinned page on d
	memGetInfo(c cuContext) (free, total uint64, err error)                // cuMemGetInfo_v2

	// The VMM calls. They run with the calling thread's stream-capture
	// mode relaxed (see XS_RELAXED), except the exports and imports.
	memAddressReserve(c cuContext, size, align uint64) (vmm.DevicePtr, error)                            // cuMemAddressReserve
	memAddressFree(c cuContext, ptr vmm.DevicePtr, size uint64) error                                    // cuMemAddressFree
	memCreate(c cuContext, size uint64, d cuDevice, types vmm.HandleType, rdma bool) (vmm.Handle, error) // cuMemCreate, pinned on d
	memRelease(c cuContext, h vmm.Handle) error                                                          // cuMemRelease
	memMap(c cuContext, ptr vmm.DevicePtr, size, offset uint64, h vmm.Handle) error                      // cuMemMap
	memUnmap(c cuContext, ptr vmm.DevicePtr, size uint64) error                                          // cuMemUnmap
	memSetAccess(c cuContext, ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) error             // cuMemSetAccess
	memGetAccess(c cuContext, d cuDevice, ptr vmm.DevicePtr) (vmm.Access, error)                         // cuMemGetAccess
	memExportFD(c cuContext, h vmm.Handle) (int, error)                                                  // cuMemExportToShareableHandle, posix fd; the fd is close-on-exec
	memExportFabric(c cuContext, h vmm.Handle) (vmm.FabricHandle, error)                                 // cuMemExportToShareableHandle, fabric
	memImportFD(c cuContext, fd int) (vmm.Handle, error)                                                 // cuMemImportFromShareableHandle, posix fd
	memImportFabric(c cuContext, fh vmm.FabricHandle) (vmm.Handle, error)                                // cuMemImportFromShareableHandle, fabric
	memAllocationProperties(c cuContext, h vmm.Handle) (vmm.Device, vmm.HandleType, error)               // cuMemGetAllocationPropertiesFromHandle

	// Streams, events, copies and plain allocations.
	streamCreate(c cuContext) (vmm.Stream, error)             // cuStreamCreate, non-blocking
	streamDestroy(c cuContext, s vmm.Stream) error            // cuStreamDestroy_v2
	streamSynchronize(c cuContext, s vmm.Stream) error        // cuStreamSynchronize
	ctxSynchronize(c cuContext) error                         // cuCtxSynchronize
	eventCreate(c cuContext) (vmm.Event, error)               // cuEventCreate, without timing
	eventRecord(c cuContext, e vmm.Event, s vmm.Stream) error // cuEventRecord
	eventQuery(c cuContext, e vmm.Event) (bool, error)        // cuEventQuery; CUDA_ERROR_NOT_READY is false, nil
	eventSynchronize(c cuContext, e vmm.Event) error          // cuEventSynchronize
	eventDestroy(c cuContext, e vmm.Event) error              // cuEventDestroy_v2
	// The synchronous copies and memset wait for the context's legacy
	// default stream before they return, so the bytes are in place.
	memcpyHtoD(c cuContext, dst vmm.DevicePtr, src []byte) error                        // cuMemcpyHtoD_v2, src not empty
	memcpyDtoH(c cuContext, dst []byte, src vmm.DevicePtr) error                        // cuMemcpyDtoH_v2, dst not empty
	memcpyDtoD(c cuContext, dst, src vmm.DevicePtr, n uint64) error                     // cuMemcpy
	memsetD8(c cuContext, dst vmm.DevicePtr, v byte, n uint64) error                    // cuMemsetD8_v2
	memsetD8Async(c cuContext, dst vmm.DevicePtr, v byte, n uint64, s vmm.Stream) error // cuMemsetD8Async
	memAlloc(c cuContext, size uint64) (vmm.DevicePtr, error)                           // cuMemAlloc_v2
	memFree(c cuContext, p vmm.DevicePtr) error                                         // cuMemFree_v2

	// Legacy IPC of plain allocations.
	ipcGetMemHandle(c cuContext, p vmm.DevicePtr) (vmm.IPCMemHandle, error)         // cuIpcGetMemHandle
	ipcOpenMemHandle(c cuContext, h vmm.IPCMemHandle) (vmm.DevicePtr, error)        // cuIpcOpenMemHandle_v2, peer access enabled lazily
	ipcCloseMemHandle(c cuContext, p vmm.DevicePtr) error                           // cuIpcCloseMemHandle
	memGetAddressRange(c cuContext, p vmm.DevicePtr) (vmm.DevicePtr, uint64, error) // cuMemGetAddressRange_v2
}
