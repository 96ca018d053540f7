package expandable

import (
	"fmt"
	"log/slog"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// Config is the allocator's configuration (see spec.Config).
type Config = spec.Config

// Allocator is the expandable-segments allocator of one device. It
// implements xseg.Allocator and is safe for concurrent use by multiple
// goroutines.
type Allocator struct {
	// PoolSet gives the private pools (xseg.Pools): CUDA graph captures.
	core.PoolSet
	// Limiter gives the memory limit (xseg.MemoryLimiter), Recorder the
	// allocation history (xseg.Historian).
	core.Limiter
	core.Recorder
	// TagSet gives the tags (xseg.Tagger): named pools whose memory can be
	// paused and resumed at the same addresses (pause.go).
	core.TagSet
	heap  *core.Heap
	d     vmm.Driver
	dev   vmm.Device
	pages *pages // the Backing, for peer access (peer.go)
}

// New makes an allocator for device dev of d. The device must support VMM
// (else the error matches vmm.ErrNotSupported) and both page sizes of cfg
// must be multiples of its granularity (else vmm.ErrInvalid). The allocator
// does not close d. log may be nil.
func New(d vmm.Driver, dev vmm.Device, cfg Config, log *slog.Logger) (*Allocator, error) {
	info, err := d.DeviceInfo(dev)
	if err != nil {
		return nil, fmt.Errorf("expandable: device %d: %w", dev, err)
	}
	if !info.VMM {
		return nil, fmt.Errorf("expandable: device %d (%s) has no virtual memory management: %w", dev, info.Name, vmm.ErrNotSupported)
	}
	g := info.Granularity
	for _, c := range cfg.PoolClasses() {
		if g == 0 || c.PageSize == 0 || c.PageSize%g != 0 {
			return nil, fmt.Errorf("expandable: %s: page size %d is not a multiple of the device's granularity %d: %w", c.PageKey, c.PageSize, g, vmm.ErrInvalid)
		}
	}
	p := &pages{d: d, dev: dev, cfg: cfg, total: info.TotalMemory, rw: vmm.ReadWrite(dev)}
	for _, pool := range spec.Pools() {
		p.cacheFrom[pool] = append([]core.Pool{pool}, cfg.PageMates(pool)...)
	}
	if cfg.Shareable {
		p.types = vmm.HandlePosixFD
	}
	h, err := core.NewHeap(d, dev, p, cfg, info.TotalMemory, log)
	if err != nil {
		return nil, fmt.Errorf("expandable: %w", err)
	}
	return &Allocator{PoolSet: core.NewPoolSet(h), Limiter: core.NewLimiter(h), Recorder: core.NewRecorder(h), TagSet: core.NewTagSet(h), heap: h, d: d, dev: dev, pages: p}, nil
}

// Device is the device the allocator hands out memory of.
func (a *Allocator) Device() vmm.Device { return a.dev }

// Driver is the driver the allocator runs on.
func (a *Allocator) Driver() vmm.Driver { return a.d }

// Config is the configuration the allocator runs with.
func (a *Allocator) Config() Config { return a.heap.Config() }

// Alloc returns a block of at least size bytes (rounded up to 512) for use
// on stream s. It never returns less; when memory runs out it follows the
// OOM policy (see the package documentation) and fails with an error
// matching vmm.ErrOutOfMemory. Size 0 is vmm.ErrInvalid.
func (a *Allocator) Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	return a.heap.Alloc(size, s)
}

// AllocReusable is Alloc that also reports whether the block may be taken
// back for the same request on s without the allocator, until anything
// else is done to it (core.Heap.AllocReusable; libxseg's C API).
func (a *Allocator) AllocReusable(size uint64, s vmm.Stream) (vmm.DevicePtr, bool, error) {
	return a.heap.AllocReusable(size, s)
}

// CountReused counts an allocation and a free of the allocated block at
// ptr that the caller made without the allocator, taking the block back
// for the same request on its stream.
func (a *Allocator) CountReused(ptr vmm.DevicePtr) error { return a.heap.CountReused(ptr) }

// AllocAtMost returns the largest block it can get of at most max and at
// least min bytes, and its size: it tries max, then shrinks the request by
// the configured OOMSizeFactor, by at least 1/64 of max and one small page
// a step (at most 65 attempts whatever the factor), until it reaches min.
func (a *Allocator) AllocAtMost(max, min uint64, s vmm.Stream) (vmm.DevicePtr, uint64, error) {
	return a.heap.AllocAtMost(max, min, s)
}

// Free gives the block at ptr back. Freeing an unknown or interior pointer,
// or a block twice, is an error matching vmm.ErrInvalid that changes
// nothing.
func (a *Allocator) Free(ptr vmm.DevicePtr) error { return a.heap.Free(ptr) }

// RecordStream marks the block at ptr as used on stream s as well: once
// freed, it is reused only after the work queued on s by then has finished.
func (a *Allocator) RecordStream(ptr vmm.DevicePtr, s vmm.Stream) error {
	return a.heap.RecordStream(ptr, s)
}

// EmptyCache gives every whole free page, every empty reservation and every
// cached physical page back to the driver.
func (a *Allocator) EmptyCache() error { return a.heap.EmptyCache() }

// SetOOMWaitHook sets f (nil: none) to be called with true as an
// allocation begins to wait or sleep in the OOM policy (Config.OOMWait,
// Config.OOMMaxRetries: once per wait and per backoff sleep) and with
// false as it stops, without the allocator's lock: for a caller that
// defers frees, to apply them and send its frees straight to Free while
// an allocation waits for them. f runs on the waiting goroutine, from
// several at once when several wait; it may call the allocator (Free
// above all) but must not wait for the allocation that called it. A panic
// in f comes out of that allocation, the allocator left working.
func (a *Allocator) SetOOMWaitHook(f func(waiting bool)) { a.heap.SetOOMWaitHook(f) }

// Stats returns the current statistics. ReservedBytes counts the physical
// pages the allocator holds: mapped ones and those kept in its page cache.
func (a *Allocator) Stats() spec.Stats { return a.heap.Stats() }

// ResetPeakStats makes every peak the current value.
func (a *Allocator) ResetPeakStats() { a.heap.ResetPeakStats() }

// ResetAccumulatedStats zeroes the statistics that only grow: totals
// allocated and freed, retries, OOMs, driver work.
func (a *Allocator) ResetAccumulatedStats() { a.heap.ResetAccumulatedStats() }

// Snapshot returns the segments, their mapped ranges and blocks.
func (a *Allocator) Snapshot() spec.Snapshot { return a.heap.Snapshot() }

// Close unmaps and releases everything the allocator holds; blocks still
// allocated become invalid. It does not close the driver. If the driver
// fails to give something back, Close returns the error and keeps what it
// holds, and the next Close retries; once a Close has returned nil, later
// ones return nil too, and other methods fail with vmm.ErrClosed.
func (a *Allocator) Close() error { return a.heap.Close() }

// DefaultConfig returns core.DefaultConfig: one pool of 2 MiB pages a
// stream, recycled where the heap grows, chunks for large growths.
func DefaultConfig() Config { return core.DefaultConfig() }

// ClassicConfig returns core.ClassicConfig: 2 MiB small pages for requests
// up to 1 MiB, 20 MiB large pages, no recycling.
func ClassicConfig() Config { return core.ClassicConfig() }

// SteadyConfig is the page policy for loops that allocate the same every
// step (spec.SteadyConfig): 2 MiB pages never moved, chunks of up to 64
// MiB never split, no page cache.
func SteadyConfig() Config { return core.SteadyConfig() }
