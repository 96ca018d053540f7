package fallback

import (
	"fmt"
	"log/slog"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// Config is the allocator's configuration (see spec.Config). The fallback
// allocator reads SmallPageSize and LargePageSize as segment sizes (see
// New for the defaults it puts in their place), has no page cache
// (PageCacheBytes is unused), and ignores the expandable allocator's page
// policy: RecyclePages, SizeClasses, PackLongLived, ChunkBytes and
// ChunkMinBytes.
type Config = spec.Config

// Allocator is the fallback allocator of one device: the block core over
// fixed segments of plain allocations. It implements xseg.Allocator and is
// safe for concurrent use by multiple goroutines.
type Allocator struct {
	// PoolSet gives the private pools (xseg.Pools): CUDA graph captures.
	core.PoolSet
	// Limiter gives the memory limit (xseg.MemoryLimiter), Recorder the
	// allocation history (xseg.Historian).
	core.Limiter
	core.Recorder
	// TagSet gives the tags (xseg.Tagger): named pools with their own
	// statistics. Pause and Resume fail with vmm.ErrNotSupported: a plain
	// allocation cannot be mapped again at its address.
	core.TagSet
	heap *core.Heap
	d    vmm.Driver
	dev  vmm.Device
	cfg  Config
	log  *slog.Logger
}

// New makes a fallback allocator for device dev of d. It needs only
// MemAlloc and MemFree, so it works on any device, with or without VMM.
// The allocator does not close d. log may be nil.
//
// It reads cfg as follows (Allocator.Config returns the result):
//
//   - RecyclePages, SizeClasses, PackLongLived, SettleChains, ChunkBytes
//     and ChunkMinBytes (XSEG_CONF's recycle_pages, size_classes,
//     pack_long_lived, settle_chains, chunk_mb, chunk_min_mb) do not
//     apply: they move or share pages of address ranges mapped on demand,
//     which plain allocations are not. They are ignored, turned off
//     whatever they say, so that one configuration serves devices with
//     and without VMM.
//   - SmallPageSize, LargePageSize and SmallLimit (small_page_mb,
//     large_page_mb, small_limit_kb) are used as given, except for the two
//     values of xseg.DefaultConfig that differ from ClassicConfig's: a
//     LargePageSize of 2 MiB becomes 20 MiB, and a SmallLimit of 0 (no
//     small pool) becomes 1 MiB (at most SmallPageSize). A Config does not
//     record which keys were set, so large_page_mb:2 and small_limit_kb:0
//     are replaced even when given on purpose; every other value is
//     honoured. The defaults thus give PyTorch's layout (DefaultConfig).
//
// Both segment sizes must be positive multiples of 512, and cfg must pass
// Config.Validate (else vmm.ErrInvalid).
func New(d vmm.Driver, dev vmm.Device, cfg Config, log *slog.Logger) (*Allocator, error) {
	info, err := d.DeviceInfo(dev)
	if err != nil {
		return nil, fmt.Errorf("fallback: device %d: %w", dev, err)
	}
	cfg = effectiveConfig(cfg)
	for _, c := range cfg.PoolClasses() {
		if c.PageSize == 0 || c.PageSize%core.MinBlock != 0 {
			return nil, fmt.Errorf("fallback: %s: segment size %d is not a positive multiple of %d: %w", c.PageKey, c.PageSize, core.MinBlock, vmm.ErrInvalid)
		}
	}
	s := &segments{d: d, dev: dev, cfg: cfg}
	h, err := core.NewHeap(d, dev, s, cfg, info.TotalMemory, log)
	if err != nil {
		return nil, fmt.Errorf("fallback: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Allocator{PoolSet: core.NewPoolSet(h), Limiter: core.NewLimiter(h), Recorder: core.NewRecorder(h), TagSet: core.NewTagSet(h), heap: h, d: d, dev: dev, cfg: cfg, log: log}, nil
}

// effectiveConfig is the configuration the fallback allocator runs with
// for cfg: the expandable allocator's page policy off, and the page
// layout's defaults replaced by ClassicConfig's, as New says.
func effectiveConfig(cfg Config) Config {
	cfg.RecyclePages, cfg.SizeClasses, cfg.ChunkBytes, cfg.ChunkMinBytes = false, false, 0, 0
	cfg.PackLongLived, cfg.SettleChains = false, false
	def, classic := core.DefaultConfig(), core.ClassicConfig()
	if cfg.LargePageSize == def.LargePageSize {
		cfg.LargePageSize = classic.LargePageSize
	}
	if cfg.SmallLimit == def.SmallLimit {
		cfg.SmallLimit = min(classic.SmallLimit, cfg.SmallPageSize)
	}
	return cfg
}

// SegmentBytes is the size of the segment NewSegment makes for a request
// of size bytes of pool p: the core checks the memory limit with it before
// the driver allocates (core.SegmentSizer).
func (s *segments) SegmentBytes(p core.Pool, size uint64) uint64 { return segmentSize(s.cfg, p, size) }

var _ core.SegmentSizer = (*segments)(nil)

// Device is the device the allocator hands out memory of.
func (a *Allocator) Device() vmm.Device { return a.dev }

// Driver is the driver the allocator runs on.
func (a *Allocator) Driver() vmm.Driver { return a.d }

// Config is the configuration the allocator runs with.
func (a *Allocator) Config() Config { return a.cfg }

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
// nothing. With a release threshold configured, Free may give wholly free
// segments back (see the package documentation); a failure to do so is
// logged, not returned, since the block itself was freed.
func (a *Allocator) Free(ptr vmm.DevicePtr) error {
	return a.heap.Free(ptr)
}

// RecordStream marks the block at ptr as used on stream s as well: once
// freed, it is reused only after the work queued on s by then has finished.
func (a *Allocator) RecordStream(ptr vmm.DevicePtr, s vmm.Stream) error {
	return a.heap.RecordStream(ptr, s)
}

// EmptyCache waits for pending frees and gives every wholly free segment
// back to the driver (MemFree), and destroys idle events.
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

// Stats returns the current statistics. ReservedBytes counts the segments
// the allocator holds; PagesCreated and Unmaps count the plain
// allocations made and freed.
func (a *Allocator) Stats() spec.Stats { return a.heap.Stats() }

// ResetPeakStats makes every peak the current value.
func (a *Allocator) ResetPeakStats() { a.heap.ResetPeakStats() }

// ResetAccumulatedStats zeroes the statistics that only grow: totals
// allocated and freed, retries, OOMs, driver work.
func (a *Allocator) ResetAccumulatedStats() { a.heap.ResetAccumulatedStats() }

// Snapshot returns the segments and their blocks; each segment is one
// page, mapped as a whole.
func (a *Allocator) Snapshot() spec.Snapshot { return a.heap.Snapshot() }

// Close frees every segment; blocks still allocated become invalid. It
// does not close the driver. If the driver fails to free a segment, Close
// returns the error and keeps the segment, and the next Close retries;
// once a Close has returned nil, later ones return nil too, and other
// methods fail with vmm.ErrClosed.
func (a *Allocator) Close() error { return a.heap.Close() }

// DefaultConfig returns core.ClassicConfig, the layout of PyTorch's own
// segments: 2 MiB small segments for requests up to 1 MiB, 20 MiB large
// segments, no release threshold. (Recycling pages and chunks need pages
// mapped on demand, which plain allocations are not.) New turns
// xseg.DefaultConfig into the same layout (see effectiveConfig).
func DefaultConfig() Config { return core.ClassicConfig() }
