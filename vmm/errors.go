package vmm

import "errors"

// Sentinel errors. Backends wrap them (fmt.Errorf("...: %w", ErrX)) or return
// error types whose Is method matches them, so callers test with errors.Is.
var (
	// ErrOutOfMemory: the device (or the host backend's configured capacity)
	// has no room for the request.
	ErrOutOfMemory = errors.New("out of memory")
	// ErrNotSupported: the backend, driver or device cannot do this at all
	// (no driver, no VMM, no fabric handles, cgo disabled).
	ErrNotSupported = errors.New("not supported")
	// ErrInvalid: the arguments are wrong: misaligned, zero or oversized
	// sizes, an address outside any reservation, an unknown handle, a double
	// release, an unmap of something not mapped.
	ErrInvalid = errors.New("invalid argument")
	// ErrInUse: the object is still in use: unreserving a range with live
	// mappings, releasing a page that is still mapped.
	ErrInUse = errors.New("resource in use")
	// ErrClosed: the driver (or the allocator above it) was closed.
	ErrClosed = errors.New("closed")
)
