package xseg

import (
	"errors"
	"fmt"
	"sync"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// engine is what both xseg allocators implement.
type engine interface {
	Allocator
	Pools
	MemoryLimiter
	Historian
	Tagger
	PinBlock(ptr vmm.DevicePtr) (handles.Pin, error)
	Pinned() int
	AllocReusable(size uint64, s vmm.Stream) (vmm.DevicePtr, bool, error)
	CountReused(ptr vmm.DevicePtr) error
	SetOOMWaitHook(f func(waiting bool))
	Device() vmm.Device
	Driver() vmm.Driver
	Config() Config
}

var (
	_ engine = (*expandable.Allocator)(nil)
	_ engine = (*fallback.Allocator)(nil)
)

// DeviceAllocator is the allocator Open returns: one device's expandable
// or fallback allocator (Kind says which) with every capability of both.
// It implements Allocator, Pools, MemoryLimiter, Historian, Tagger,
// PeerAccessor and ipc.BlockSource; where the allocator underneath cannot do something
// (peer access on fallback), the method fails with an error matching
// vmm.ErrNotSupported. When Open opened the driver, Close closes it.
//
// A DeviceAllocator is safe for concurrent use by multiple goroutines.
type DeviceAllocator struct {
	e    engine
	kind AllocatorKind
	// closeDriver closes the driver Open opened, once; nil when the
	// caller gave the driver.
	closeDriver func() error
}

var (
	_ Allocator     = (*DeviceAllocator)(nil)
	_ Pools         = (*DeviceAllocator)(nil)
	_ MemoryLimiter = (*DeviceAllocator)(nil)
	_ Historian     = (*DeviceAllocator)(nil)
	_ PeerAccessor  = (*DeviceAllocator)(nil)
)

// newDeviceAllocator wraps e; if owned, Close closes e's driver too.
func newDeviceAllocator(e engine, kind AllocatorKind, owned bool) *DeviceAllocator {
	a := &DeviceAllocator{e: e, kind: kind}
	if owned {
		a.closeDriver = sync.OnceValue(e.Driver().Close)
	}
	return a
}

// Kind is the allocator underneath: AllocatorExpandable or
// AllocatorFallback.
func (a *DeviceAllocator) Kind() AllocatorKind { return a.kind }

// Device is the device the allocator hands out memory of.
func (a *DeviceAllocator) Device() vmm.Device { return a.e.Device() }

// Driver is the driver the allocator runs on.
func (a *DeviceAllocator) Driver() vmm.Driver { return a.e.Driver() }

// Config is the configuration the allocator runs with.
func (a *DeviceAllocator) Config() Config { return a.e.Config() }

// Alloc returns a block of at least size bytes for use on stream s (see
// Allocator).
func (a *DeviceAllocator) Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	return a.e.Alloc(size, s)
}

// AllocReusable is Alloc that also reports whether the block may be taken
// back for the same request on s without the allocator (C code that parks
// frees: libxseg), until anything else is done to it or the allocator.
func (a *DeviceAllocator) AllocReusable(size uint64, s vmm.Stream) (vmm.DevicePtr, bool, error) {
	return a.e.AllocReusable(size, s)
}

// CountReused counts an allocation and a free of the allocated block at
// ptr made without the allocator: the block was freed and taken back for
// the same request on its stream.
func (a *DeviceAllocator) CountReused(ptr vmm.DevicePtr) error { return a.e.CountReused(ptr) }

// AllocAtMost returns the largest block it can get of at most max and at
// least min bytes, and its size.
func (a *DeviceAllocator) AllocAtMost(max, min uint64, s vmm.Stream) (vmm.DevicePtr, uint64, error) {
	return a.e.AllocAtMost(max, min, s)
}

// Free gives a block back.
func (a *DeviceAllocator) Free(ptr vmm.DevicePtr) error { return a.e.Free(ptr) }

// RecordStream marks a block as used on stream s as well.
func (a *DeviceAllocator) RecordStream(ptr vmm.DevicePtr, s vmm.Stream) error {
	return a.e.RecordStream(ptr, s)
}

// EmptyCache gives every whole free page (segment, for fallback) back to
// the driver.
func (a *DeviceAllocator) EmptyCache() error { return a.e.EmptyCache() }

// SetOOMWaitHook sets f (nil: none) to be called with true as an
// allocation begins to wait or sleep in the OOM policy (Config.OOMWait,
// Config.OOMMaxRetries: once per wait and per backoff sleep) and with
// false as it stops, without the allocator's lock: for a caller that
// defers frees, to apply them and send its frees straight to Free while
// an allocation waits for them. f runs on the waiting goroutine, from
// several at once when several wait; it may call the allocator (Free
// above all) but must not wait for the allocation that called it. A panic
// in f comes out of that allocation, the allocator left working.
func (a *DeviceAllocator) SetOOMWaitHook(f func(waiting bool)) { a.e.SetOOMWaitHook(f) }

// Stats returns the current statistics.
func (a *DeviceAllocator) Stats() Stats { return a.e.Stats() }

// ResetPeakStats makes every peak the current value.
func (a *DeviceAllocator) ResetPeakStats() { a.e.ResetPeakStats() }

// ResetAccumulatedStats zeroes the statistics that only grow.
func (a *DeviceAllocator) ResetAccumulatedStats() { a.e.ResetAccumulatedStats() }

// Snapshot returns the segments, mapped ranges and blocks.
func (a *DeviceAllocator) Snapshot() Snapshot { return a.e.Snapshot() }

// Close frees everything the allocator holds, then closes the driver if
// Open opened it (once, whatever the allocator's Close returned). See
// Allocator for what a failed Close keeps.
func (a *DeviceAllocator) Close() error {
	err := a.e.Close()
	if a.closeDriver != nil {
		if derr := a.closeDriver(); derr != nil {
			err = errors.Join(err, fmt.Errorf("xseg: closing the %s driver: %w", a.e.Driver().Backend(), derr))
		}
	}
	return err
}

// PinBlock keeps the pages behind the live block at ptr out of reuse
// until the Pin's Unpin: the ipc.BlockSource that ipc.Exporter.ShareBlock
// shares. The expandable allocator pins whole pages and needs
// Config.Shareable (else an error matching vmm.ErrNotSupported); the
// fallback allocator pins the block's whole segment.
func (a *DeviceAllocator) PinBlock(ptr vmm.DevicePtr) (handles.Pin, error) {
	return a.e.PinBlock(ptr)
}

// Pinned reports how many blocks are pinned now.
func (a *DeviceAllocator) Pinned() int { return a.e.Pinned() }

// peers is the allocator as a PeerAccessor, or an error matching
// vmm.ErrNotSupported.
func (a *DeviceAllocator) peers(peer vmm.Device) (PeerAccessor, error) {
	if p, ok := a.e.(PeerAccessor); ok {
		return p, nil
	}
	return nil, fmt.Errorf("xseg: peer access of device %d to device %d: the %s allocator cannot grant it: %w",
		peer, a.e.Device(), a.kind, vmm.ErrNotSupported)
}

// EnablePeerAccess grants device peer read-write access to every page
// mapped now and later (see PeerAccessor). The fallback allocator cannot:
// its error matches vmm.ErrNotSupported.
func (a *DeviceAllocator) EnablePeerAccess(peer vmm.Device) error {
	p, err := a.peers(peer)
	if err != nil {
		return err
	}
	return p.EnablePeerAccess(peer)
}

// DisablePeerAccess takes back what EnablePeerAccess granted. The
// fallback allocator's error matches vmm.ErrNotSupported.
func (a *DeviceAllocator) DisablePeerAccess(peer vmm.Device) error {
	p, err := a.peers(peer)
	if err != nil {
		return err
	}
	return p.DisablePeerAccess(peer)
}

// BeginAllocateToPool routes the allocations filter accepts to private
// pool id (see Pools). filter runs under the allocator's lock: it must
// not call the allocator.
func (a *DeviceAllocator) BeginAllocateToPool(id PoolID, filter func(vmm.Stream) bool) error {
	return a.e.BeginAllocateToPool(id, filter)
}

// EndAllocateToPool stops routing allocations to pool id.
func (a *DeviceAllocator) EndAllocateToPool(id PoolID) error { return a.e.EndAllocateToPool(id) }

// RetainPool adds a use of pool id.
func (a *DeviceAllocator) RetainPool(id PoolID) error { return a.e.RetainPool(id) }

// ReleasePool drops a use of pool id.
func (a *DeviceAllocator) ReleasePool(id PoolID) error { return a.e.ReleasePool(id) }

// AllocInPool allocates size bytes for stream s from pool id.
func (a *DeviceAllocator) AllocInPool(id PoolID, size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	return a.e.AllocInPool(id, size, s)
}

// PoolAllocations lists the allocated blocks of pool id.
func (a *DeviceAllocator) PoolAllocations(id PoolID) ([]vmm.DevicePtr, error) {
	return a.e.PoolAllocations(id)
}

// CheckpointPool returns the allocation state of pool id.
func (a *DeviceAllocator) CheckpointPool(id PoolID) (PoolCheckpoint, error) {
	return a.e.CheckpointPool(id)
}

// RestorePool puts a pool back to a checkpoint.
func (a *DeviceAllocator) RestorePool(cp PoolCheckpoint) (freed, allocated []vmm.DevicePtr, err error) {
	return a.e.RestorePool(cp)
}

// SetMemoryLimit caps the reserved bytes; 0 removes the cap (see
// MemoryLimiter).
func (a *DeviceAllocator) SetMemoryLimit(bytes uint64) { a.e.SetMemoryLimit(bytes) }

// SetMemoryFraction caps the reserved bytes at a fraction of the device's
// memory.
func (a *DeviceAllocator) SetMemoryFraction(fraction float64) error {
	return a.e.SetMemoryFraction(fraction)
}

// MemoryLimit returns the cap in bytes, 0 when there is none (and for a
// memory fraction of 0: Stats().MemoryLimitSet tells them apart).
func (a *DeviceAllocator) MemoryLimit() uint64 { return a.e.MemoryLimit() }

// MemoryFraction returns the cap as a fraction of the device's memory.
func (a *DeviceAllocator) MemoryFraction() float64 { return a.e.MemoryFraction() }

// RecordHistory keeps the last maxEntries events (see Historian).
func (a *DeviceAllocator) RecordHistory(maxEntries int) error { return a.e.RecordHistory(maxEntries) }

// History returns a copy of the recorded events, oldest first.
func (a *DeviceAllocator) History() []HistoryEvent { return a.e.History() }
