package core

import (
	"errors"
	"fmt"
	"math"

	"github.com/xseg-dev/xseg/vmm"
)

// The memory limit is PyTorch's per-process memory fraction
// (torch.cuda.set_per_process_memory_fraction): the reserved bytes (mapped
// pages and the Backing's page cache, as Stats.ReservedBytes counts them)
// may not grow past it. Growth that would pass it fails as out of memory
// inside the OOM policy, which first empties the cache and retries, as
// PyTorch does; the waits and delayed retries of the policy are skipped,
// since no other process can lift a limit this process set. Reusing cached
// pages reserves nothing new and is always allowed, so a limit set below
// the reserved bytes only stops growth until frees and EmptyCache bring
// them under it.

// memLimit is a Heap's memory limit.
type memLimit struct {
	on    bool
	bytes uint64
	// fraction and total: the memory fraction it was set from and the
	// device memory that was of; fraction < 0 when it was set in bytes.
	fraction float64
	total    uint64
}

// limitError is the cause of a failed growth that the memory limit
// stopped. It matches vmm.ErrOutOfMemory.
type limitError struct {
	grow, reserved uint64
	lim            memLimit
}

func (e *limitError) Error() string {
	by := ""
	if e.lim.fraction >= 0 {
		by = fmt.Sprintf(", set as memory fraction %g of the device's %d bytes", e.lim.fraction, e.lim.total)
	}
	return fmt.Sprintf("stopped by the memory limit: %d more bytes would take the %d bytes this allocator reserves past its memory limit of %d bytes%s: %v",
		e.grow, e.reserved, e.lim.bytes, by, vmm.ErrOutOfMemory)
}

func (e *limitError) Unwrap() error { return vmm.ErrOutOfMemory }

// limited reports whether err is an OOM that the memory limit decided:
// one that waiting or retrying cannot cure.
func limited(err error) bool {
	var le *limitError
	return errors.As(err, &le)
}

// retryable reports whether the OOM policy should wait and retry after
// err: an OOM that the memory limit did not decide.
func retryable(err error) bool {
	return errors.Is(err, vmm.ErrOutOfMemory) && !limited(err)
}

// SegmentSizer is an optional interface of a Backing whose segments start
// mapped (StartsMapped): the bytes NewSegment would make for a request of
// size bytes of pool p. With it the Heap checks the memory limit before
// the driver allocates; a Backing whose segments start mapped must
// implement it for the limit to hold.
type SegmentSizer interface {
	SegmentBytes(p Pool, size uint64) uint64
}

// limitLocked fails with a *limitError when reserving grow more bytes
// would pass the memory limit.
func (h *Heap) limitLocked(grow uint64) error {
	lim := h.mu.memLimit
	if !lim.on || grow == 0 {
		return nil
	}
	r := uint64(max(0, h.mu.stats.ReservedBytes.All.Current))
	if r+grow >= r && r+grow <= lim.bytes {
		return nil
	}
	return &limitError{grow: grow, reserved: r, lim: lim}
}

// SetMemoryLimit caps the bytes the Heap may reserve; 0 removes the cap.
// A cap below the bytes reserved now is allowed: growth fails until frees
// and EmptyCache bring them under it.
func (h *Heap) SetMemoryLimit(bytes uint64) {
	h.setLimit(memLimit{on: bytes > 0, bytes: bytes, fraction: -1})
}

// SetMemoryFraction caps the bytes the Heap may reserve at fraction of the
// device's total memory (as the driver's MemInfo reports it), rounded
// down, as PyTorch's set_per_process_memory_fraction does: 0 allows no
// growth at all, 1 the whole device. A fraction outside [0, 1] is an error
// matching vmm.ErrInvalid that changes nothing.
func (h *Heap) SetMemoryFraction(fraction float64) error {
	if !(fraction >= 0 && fraction <= 1) {
		return fmt.Errorf("setting memory fraction %v: not in [0, 1]: %w", fraction, vmm.ErrInvalid)
	}
	h.mu.Lock()
	closed := h.mu.closed
	h.mu.Unlock()
	if closed {
		return fmt.Errorf("setting memory fraction %v: %w", fraction, vmm.ErrClosed)
	}
	_, total, err := h.drv.MemInfo(h.dev)
	if err != nil {
		return fmt.Errorf("setting memory fraction %v: memory of device %d: %w", fraction, h.dev, err)
	}
	h.setLimit(memLimit{on: true, bytes: uint64(math.Floor(fraction * float64(total))), fraction: fraction, total: total})
	return nil
}

func (h *Heap) setLimit(lim memLimit) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.memLimit = lim
	h.mu.stats.MemoryLimit, h.mu.stats.MemoryLimitSet = lim.bytes, lim.on
}

// MemoryLimit returns the cap on reserved bytes, 0 when there is none. A
// memory fraction of 0, which allows no growth at all, reads 0 too
// (Stats.MemoryLimitSet tells them apart).
func (h *Heap) MemoryLimit() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.memLimit.bytes
}

// MemoryFraction returns the memory limit as a fraction of the device's
// memory: the fraction SetMemoryFraction set, or for a limit set in bytes
// the limit over the device's total; 0 when there is no limit (and for a
// fraction of 0).
func (h *Heap) MemoryFraction() float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	lim := h.mu.memLimit
	switch {
	case !lim.on:
		return 0
	case lim.fraction >= 0:
		return lim.fraction
	}
	return float64(lim.bytes) / float64(h.limit)
}

// Limiter is the memory-limit half of an allocator's API (the root
// package's xseg.MemoryLimiter), over a Heap. Both allocators embed it.
type Limiter struct{ h *Heap }

// NewLimiter returns the memory limit of h.
func NewLimiter(h *Heap) Limiter { return Limiter{h: h} }

// SetMemoryLimit caps the bytes the allocator may reserve; 0 removes the
// cap.
func (l Limiter) SetMemoryLimit(bytes uint64) { l.h.SetMemoryLimit(bytes) }

// SetMemoryFraction caps the bytes the allocator may reserve at fraction
// of the device's memory, in [0, 1].
func (l Limiter) SetMemoryFraction(fraction float64) error { return l.h.SetMemoryFraction(fraction) }

// MemoryLimit returns the cap on reserved bytes, 0 when there is none (and
// for a fraction of 0: Stats.MemoryLimitSet tells them apart).
func (l Limiter) MemoryLimit() uint64 { return l.h.MemoryLimit() }

// MemoryFraction returns the cap as a fraction of the device's memory, 0
// when there is none.
func (l Limiter) MemoryFraction() float64 { return l.h.MemoryFraction() }
