package vmm

import "fmt"

// DevicePtr is an address in the unified address space of the backend: a
// CUDA device pointer, or a host virtual address for the host backend. It is
// an integer on purpose: it is never dereferenced by Go code.
type DevicePtr uintptr

func (p DevicePtr) String() string { return fmt.Sprintf("%#x", uintptr(p)) }

// Add returns p advanced by n bytes.
func (p DevicePtr) Add(n uint64) DevicePtr { return p + DevicePtr(n) }

// Device is a device ordinal, 0 to DeviceCount()-1.
type Device int

// Stream is an opaque stream of work on a device. Stream 0 is the default
// stream of the device's context. For CUDA it is a CUstream.
type Stream uintptr

// Event is an opaque marker recorded on a stream; it completes when the work
// queued on the stream before it has finished. For CUDA it is a CUevent.
type Event uintptr

// Handle names a physical page (CUDA: CUmemGenericAllocationHandle) created by
// Create or ImportFD / ImportFabric and not yet released.
type Handle uint64

// HandleType is a set of shareable handle kinds a page can be exported as.
// The values are those of CUmemAllocationHandleType.
type HandleType uint32

const (
	// HandleNone: the page cannot be exported.
	HandleNone HandleType = 0
	// HandlePosixFD: the page can be exported as a file descriptor.
	HandlePosixFD HandleType = 0x1
	// HandleFabric: the page can be exported as a 64-byte fabric handle,
	// importable on other nodes of an NVLink fabric.
	HandleFabric HandleType = 0x8
)

func (t HandleType) String() string {
	switch t {
	case HandleNone:
		return "none"
	case HandlePosixFD:
		return "posix-fd"
	case HandleFabric:
		return "fabric"
	case HandlePosixFD | HandleFabric:
		return "posix-fd|fabric"
	}
	return fmt.Sprintf("HandleType(%#x)", uint32(t))
}

// FabricHandle is the exported form of a page created with HandleFabric.
type FabricHandle [64]byte

// IPCMemHandle is CUDA's legacy IPC handle of a plain allocation
// (CUipcMemHandle): 64 opaque bytes that name one cuMemAlloc allocation of
// the exporting process. Like a fabric handle, its bytes are the
// capability: treat them as a secret.
type IPCMemHandle [64]byte

// Access is the protection a device gets on a mapped range. The values are
// those of CUmemAccess_flags.
type Access uint32

const (
	AccessNone      Access = 0
	AccessRead      Access = 1
	AccessReadWrite Access = 3
)

// AccessDesc grants one device one kind of access.
type AccessDesc struct {
	Device Device
	Flags  Access
}

// ReadWrite is the access descriptor list that grants dev read and write
// access, the common case.
func ReadWrite(dev Device) []AccessDesc { return []AccessDesc{{Device: dev, Flags: AccessReadWrite}} }

// DeviceInfo describes one device.
type DeviceInfo struct {
	Ordinal     Device
	Name        string
	UUID        [16]byte
	TotalMemory uint64
	// VMM: the device supports virtual memory management (Reserve, Create,
	// Map, SetAccess). Without it only MemAlloc / MemFree work.
	VMM bool
	// PosixFD and Fabric: pages can be created exportable as these kinds.
	PosixFD bool
	Fabric  bool
	// RDMAWithVMM: GPUDirect RDMA works on VMM-mapped memory.
	RDMAWithVMM bool
	// Granularity is the minimum page size (and alignment) of Create and
	// Map; RecommendedGranularity the size the driver recommends.
	Granularity            uint64
	RecommendedGranularity uint64
}

// UUIDString formats the UUID as nvidia-smi does (GPU-xxxxxxxx-xxxx-...).
func (d DeviceInfo) UUIDString() string {
	u := d.UUID
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Usage counts what a Driver has outstanding: reservations, physical pages,
// mappings, plain allocations, streams and events this process created and
// has not yet given back. Tests use it to prove that nothing leaked.
type Usage struct {
	Ranges      int
	RangeBytes  uint64
	Handles     int
	HandleBytes uint64
	Mappings    int
	MappedBytes uint64
	Allocs      int
	AllocBytes  uint64
	// IPCOpens counts the allocations of other processes opened with
	// OpenAllocIPC and not yet closed, IPCOpenBytes their size.
	IPCOpens     int
	IPCOpenBytes uint64
	Streams      int
	Events       int
}

// Zero reports whether nothing is outstanding.
func (u Usage) Zero() bool { return u == Usage{} }

func (u Usage) String() string {
	return fmt.Sprintf("ranges=%d (%d B) handles=%d (%d B) mappings=%d (%d B) allocs=%d (%d B) ipc-opens=%d (%d B) streams=%d events=%d",
		u.Ranges, u.RangeBytes, u.Handles, u.HandleBytes, u.Mappings, u.MappedBytes, u.Allocs, u.AllocBytes,
		u.IPCOpens, u.IPCOpenBytes, u.Streams, u.Events)
}
