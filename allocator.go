package xseg

import (
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// Stats are an allocator's statistics, with PyTorch's meanings (see
// spec.Stats).
type Stats = spec.Stats

// Snapshot is an allocator's segments, mapped ranges and blocks (see
// spec.Snapshot).
type Snapshot = spec.Snapshot

// Allocator hands out device memory in blocks. Both xseg allocators
// (expandable and fallback) implement it. Implementations are safe for
// concurrent use by multiple goroutines.
type Allocator interface {
	// Alloc returns a block of at least size bytes for use on stream s.
	// It never returns less; when memory runs out it follows the OOM
	// policy and fails with an error matching vmm.ErrOutOfMemory.
	Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error)
	// AllocAtMost returns the largest block it can get of at most max and
	// at least min bytes, and its size.
	AllocAtMost(max, min uint64, s vmm.Stream) (vmm.DevicePtr, uint64, error)
	// Free gives a block back. Freeing an unknown or interior pointer, or a
	// block twice, is an error matching vmm.ErrInvalid that changes nothing.
	Free(ptr vmm.DevicePtr) error
	// RecordStream marks a block as used on stream s as well: when freed,
	// it is reused only after the work queued on s by then has finished.
	RecordStream(ptr vmm.DevicePtr, s vmm.Stream) error
	// EmptyCache gives every whole free page (segment, for fallback) back
	// to the driver.
	EmptyCache() error
	// Stats returns the current statistics.
	Stats() Stats
	// ResetPeakStats makes every peak the current value.
	ResetPeakStats()
	// ResetAccumulatedStats zeroes the statistics that only grow (totals
	// allocated and freed, retries, OOMs, driver work).
	ResetAccumulatedStats()
	// Snapshot returns the segments, mapped ranges and blocks.
	Snapshot() Snapshot
	// Close frees everything the allocator holds. Blocks still allocated
	// become invalid. A Close that fails keeps what it could not give
	// back and the next Close retries it; after a Close returned nil,
	// Close returns nil and the other methods fail with vmm.ErrClosed.
	Close() error
}
