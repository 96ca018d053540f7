package vmm

import "fmt"

// Driver is the contract every memory backend meets: the role interfaces
// below, each of which a consumer can ask for alone (package pagerun needs
// Pages and nothing else, say). All sizes and offsets of the address-range
// and page methods are multiples of the device's granularity
// (DeviceInfo.Granularity) unless a method says otherwise; a violation is
// ErrInvalid. A Driver is safe for concurrent use.
//
// What only one backend can do is an optional interface, found with a type
// assertion: AllocIPC (CUDA's legacy IPC of plain allocations), AllocFD
// (the host backend's memory files of plain allocations) and
// AsyncMemsetter (queued memsets, for tests that keep a stream busy).
type Driver interface {
	Devices
	Ranges
	Pages
	PageSharing
	Streams
	Copies
	PlainAllocs
	Lifecycle
}

// Devices describes the driver and its devices.
type Devices interface {
	// Backend names the backend: "cuda" or "host".
	Backend() string
	// DriverVersion is the driver's version as CUDA encodes it
	// (1000*major + 10*minor); the host backend reports 0.
	DriverVersion() (int, error)
	// DeviceCount is the number of devices.
	DeviceCount() (int, error)
	// DeviceInfo describes a device.
	DeviceInfo(dev Device) (DeviceInfo, error)
	// MemInfo reports free and total bytes of a device.
	MemInfo(dev Device) (free, total uint64, err error)
}

// Ranges sets address ranges aside and gives them back.
type Ranges interface {
	// Reserve makes a new range of size bytes, aligned to align (0: the
	// granularity), in state reserved: addresses set aside, nothing behind
	// them. none -> reserved.
	Reserve(size, align uint64) (DevicePtr, error)
	// Unreserve gives back a whole range made by Reserve. Nothing in it may
	// be mapped (ErrInUse). reserved -> none.
	Unreserve(ptr DevicePtr, size uint64) error
}

// Pages creates physical pages and maps them into ranges.
type Pages interface {
	// Create makes a physical page of size bytes on dev, exportable as the
	// kinds in types. Beyond the device's memory it fails with
	// ErrOutOfMemory.
	Create(dev Device, size uint64, types HandleType) (Handle, error)
	// Release destroys a page. It may not be mapped (ErrInUse); releasing
	// an unknown or already released handle is ErrInvalid.
	Release(h Handle) error

	// Map puts page h behind [ptr, ptr+size), which must lie inside one
	// reservation and overlap no mapping. Only whole pages can be mapped:
	// offset must be 0 and size the page's size (CUDA's cuMemMap allows
	// nothing else); anything else is ErrNotSupported on every backend.
	// The range is not yet accessible. reserved -> mapped.
	Map(ptr DevicePtr, size uint64, h Handle, offset uint64) error
	// Unmap removes the mappings that exactly cover [ptr, ptr+size): one
	// mapping or a run of adjacent whole mappings. mapped/accessible ->
	// reserved. If it fails part way, the mappings it removed are gone and
	// the rest stay; the error says so.
	Unmap(ptr DevicePtr, size uint64) error
	// SetAccess sets the access of the listed devices to [ptr, ptr+size),
	// which must be covered entirely by mappings (a run of pages takes one
	// call). mapped -> accessible.
	SetAccess(ptr DevicePtr, size uint64, access []AccessDesc) error
	// GetAccess reports the access dev has to the mapping that contains
	// ptr (any address inside it): what SetAccess granted it last,
	// AccessNone if nothing. An address that is not mapped is ErrInvalid,
	// as is a device past the last.
	GetAccess(ptr DevicePtr, dev Device) (Access, error)
}

// PageSharing exports pages to other processes and imports theirs.
type PageSharing interface {
	// ExportFD returns a new file descriptor, owned by the caller, that
	// names page h, which must have been created with HandlePosixFD.
	ExportFD(h Handle) (int, error)
	// ImportFD makes a handle for the page that fd names (an fd from
	// ExportFD, perhaps of another process). The fd is not consumed.
	ImportFD(fd int) (Handle, error)
	// ExportFabric returns the fabric handle of a page created with
	// HandleFabric.
	ExportFabric(h Handle) (FabricHandle, error)
	// ImportFabric makes a handle for the page a fabric handle names.
	ImportFabric(fh FabricHandle) (Handle, error)
}

// Streams orders work: streams, events and synchronization.
type Streams interface {
	// StreamCreate makes a non-blocking stream on dev.
	StreamCreate(dev Device) (Stream, error)
	// StreamDestroy destroys a stream made by StreamCreate.
	StreamDestroy(s Stream) error
	// StreamSynchronize waits for all work queued on s.
	StreamSynchronize(s Stream) error
	// DeviceSynchronize waits for all work queued on dev, on every stream
	// (a CUDA graph replays on whichever stream launched it).
	DeviceSynchronize(dev Device) error
	// EventCreate makes an event on dev (timing disabled).
	EventCreate(dev Device) (Event, error)
	// EventRecord records e on s: e completes when the work queued on s so
	// far has finished.
	EventRecord(e Event, s Stream) error
	// EventQuery reports whether e has completed, without waiting.
	EventQuery(e Event) (bool, error)
	// EventSynchronize waits for e to complete.
	EventSynchronize(e Event) error
	// EventDestroy destroys an event.
	EventDestroy(e Event) error
}

// Copies moves and sets bytes in device memory, waiting for the work.
type Copies interface {
	// CopyHtoD copies src to device memory at dst and waits for the copy.
	CopyHtoD(dst DevicePtr, src []byte) error
	// CopyDtoH copies len(dst) bytes from device memory at src and waits.
	CopyDtoH(dst []byte, src DevicePtr) error
	// CopyDtoD copies n bytes between device addresses (of the same or of
	// two devices) and waits.
	CopyDtoD(dst, src DevicePtr, n uint64) error
	// Memset sets n bytes at dst to value and waits. Any size is allowed.
	Memset(dst DevicePtr, value byte, n uint64) error
}

// AsyncMemsetter is optional: queued memsets, which tests use to keep a
// stream busy. Both backends have it.
type AsyncMemsetter interface {
	// MemsetAsync queues the same work on stream s and returns without
	// waiting (the host backend, whose streams are synchronous, does it at
	// once). Tests use it to keep a stream busy.
	MemsetAsync(dst DevicePtr, value byte, n uint64, s Stream) error
}

// PlainAllocs makes allocations without VMM (cuMemAlloc).
type PlainAllocs interface {
	// MemAlloc makes a plain allocation of size bytes (any size) on dev,
	// readable and writable by dev at once: cuMemAlloc, for devices and
	// drivers without VMM.
	MemAlloc(dev Device, size uint64) (DevicePtr, error)
	// MemFree frees an allocation made by MemAlloc.
	MemFree(ptr DevicePtr) error
}

// Sharing plain allocations with other processes. A VMM page is shared
// through PageSharing; a plain allocation has no page handle, so each
// backend offers its own way as an optional interface. A wrapping driver
// (vmmtest.Faulty) may have both and answer ErrNotSupported for the one
// its backend lacks.

// AllocIPC is CUDA's way (vmm/cuda has it; the host backend does not).
type AllocIPC interface {
	// ExportAllocIPC returns CUDA's legacy IPC handle (cuIpcGetMemHandle)
	// of the plain allocation that starts at ptr, a pointer MemAlloc
	// returned (else ErrInvalid). The handle names the whole allocation.
	ExportAllocIPC(ptr DevicePtr) (IPCMemHandle, error)
	// OpenAllocIPC maps the allocation that h names, exported by another
	// process, into this one for dev (cuIpcOpenMemHandle, peer access
	// enabled lazily), read-write, and returns its base address and size.
	// Usage counts it (IPCOpens) until CloseAllocIPC. CUDA opens a handle
	// once per process and refuses it in the exporting process; callers
	// share one open (package ipc does). Copies and memsets may touch it
	// like a MemAlloc allocation.
	OpenAllocIPC(h IPCMemHandle, dev Device) (DevicePtr, uint64, error)
	// CloseAllocIPC unmaps an allocation opened by OpenAllocIPC (ptr is
	// the base it returned; anything else is ErrInvalid).
	CloseAllocIPC(ptr DevicePtr) error
}

// AllocFD is the host backend's way (vmm/host has it; CUDA does not).
type AllocFD interface {
	// ExportAllocFD returns a new file descriptor, owned by the caller, of
	// a memory file that holds the plain allocation starting at ptr (a
	// pointer MemAlloc returned, else ErrInvalid), and the file's size: the
	// allocation's size rounded up to the granularity. An importer maps
	// the file as it maps an exported page (ImportFD, Reserve, Map,
	// SetAccess).
	ExportAllocFD(ptr DevicePtr) (fd int, size uint64, err error)
}

// Lifecycle reports what the driver holds and closes it.
type Lifecycle interface {
	// Usage reports what this driver has outstanding.
	Usage() Usage
	// Close releases the driver's own resources. It does not free what the
	// caller still holds; Usage says what that is. Calls after Close fail
	// with ErrClosed. Close is idempotent.
	Close() error
}

// AllocIPCOf returns d's AllocIPC, or an error wrapping ErrNotSupported
// that names the backend when d has none.
func AllocIPCOf(d Driver) (AllocIPC, error) {
	if a, ok := d.(AllocIPC); ok {
		return a, nil
	}
	return nil, notSupported(d, "CUDA IPC of plain allocations")
}

// AllocFDOf returns d's AllocFD, or an error wrapping ErrNotSupported that
// names the backend when d has none.
func AllocFDOf(d Driver) (AllocFD, error) {
	if a, ok := d.(AllocFD); ok {
		return a, nil
	}
	return nil, notSupported(d, "memory files of plain allocations")
}

// AsyncMemsetterOf returns d's AsyncMemsetter, or an error wrapping
// ErrNotSupported that names the backend when d has none.
func AsyncMemsetterOf(d Driver) (AsyncMemsetter, error) {
	if a, ok := d.(AsyncMemsetter); ok {
		return a, nil
	}
	return nil, notSupported(d, "queued memsets")
}

func notSupported(d Driver, what string) error {
	return fmt.Errorf("vmm: the %s backend has no %s: %w", d.Backend(), what, ErrNotSupported)
}
