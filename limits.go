package xseg

import (
	"fmt"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// MemoryLimiter caps the memory an allocator reserves, as PyTorch's
// torch.cuda.set_per_process_memory_fraction does. Both allocators
// implement it.
//
// The reserved bytes (Stats.ReservedBytes: mapped pages and cached ones)
// may not grow past the limit. An allocation that would need that fails
// with an error matching vmm.ErrOutOfMemory that names the limit, after
// the OOM policy has emptied the cache and retried once; the policy's
// waits and delayed retries are skipped, as they cannot lift a limit this
// process set. A limit below the bytes reserved now stops only growth.
type MemoryLimiter interface {
	// SetMemoryLimit sets the limit in bytes; 0 removes it.
	SetMemoryLimit(bytes uint64)
	// SetMemoryFraction sets the limit to fraction (in [0, 1], else
	// vmm.ErrInvalid) of the device's total memory, rounded down: 0
	// allows no growth, 1 the whole device.
	SetMemoryFraction(fraction float64) error
	// MemoryLimit returns the limit in bytes, 0 when there is none (and
	// for a fraction of 0: Stats().MemoryLimitSet tells them apart).
	MemoryLimit() uint64
	// MemoryFraction returns the limit as a fraction of the device's
	// memory (the one set, if set as one), 0 when there is none (and for
	// a fraction of 0; see Stats().MemoryLimitSet).
	MemoryFraction() float64
}

// HistoryEvent is one event of an allocator's history (see
// spec.HistoryEvent and the Action constants there).
type HistoryEvent = spec.HistoryEvent

// MaxHistoryEntries bounds Historian.RecordHistory's maxEntries.
const MaxHistoryEntries = spec.MaxHistoryEntries

// Historian keeps an allocator's recent events, as PyTorch's
// torch.cuda.memory._record_memory_history does for memory_viz: blocks
// allocated ("alloc"), freed ("free_requested") and reusable again
// ("free_completed"), pages mapped and unmapped ("segment_map",
// "segment_unmap"), plain segments made and freed by the fallback
// allocator ("segment_alloc", "segment_free"), and out-of-memory errors
// ("oom"). Both allocators implement it. Off, it costs a nil check an
// event.
type Historian interface {
	// RecordHistory keeps the last maxEntries events (at most
	// MaxHistoryEntries, else vmm.ErrInvalid); 0 turns it off and drops
	// them.
	RecordHistory(maxEntries int) error
	// History returns a copy of the events, oldest first.
	History() []HistoryEvent
}

// LimiterOf returns a's memory limit: a itself for both xseg allocators
// and for Open's DeviceAllocator, else an error matching
// vmm.ErrNotSupported.
func LimiterOf(a Allocator) (MemoryLimiter, error) {
	if l, ok := a.(MemoryLimiter); ok {
		return l, nil
	}
	return nil, fmt.Errorf("%T has no memory limit: %w", a, vmm.ErrNotSupported)
}

// HistorianOf returns a's history: a itself for both xseg allocators
// and for Open's DeviceAllocator, else an error matching
// vmm.ErrNotSupported.
func HistorianOf(a Allocator) (Historian, error) {
	if h, ok := a.(Historian); ok {
		return h, nil
	}
	return nil, fmt.Errorf("%T keeps no allocation history: %w", a, vmm.ErrNotSupported)
}
