package core

import "github.com/xseg-dev/xseg/vmm"

// Backing is what differs between allocators: where segments come from and
// how pages behind them are made usable and given back. The expandable
// allocator reserves large ranges per (stream, pool), sized by the Heap,
// and maps pages into them on demand; the fallback allocator makes each segment one plain
// allocation that is mapped from the start and is its own single page.
//
// The Heap calls a Backing only with its own lock held, so a Backing needs
// no lock of its own for the state the Heap hands it. Every method either
// succeeds or leaves things as they were (Unmap: see there); it counts the
// driver work it does in st (Maps, Unmaps, SetAccessCalls, PagesCreated,
// PagesReused), never the byte counters, which the Heap keeps.
type Backing interface {
	// NewSegment makes a segment for seg.Stream and seg.Pool that can
	// hold at least size bytes, and fills in seg.Base, seg.Size,
	// seg.PageSize (which divides seg.Size) and seg.StartsMapped. A
	// segment that starts mapped is usable at once; otherwise nothing in
	// it is mapped, and size is the address space the Heap wants
	// reserved (see Heap.reservationLocked), which the Backing rounds up
	// to its page size and should not exceed by more. The Heap stores
	// its own state in seg.Data's siblings; the Backing may keep its own
	// in seg.Data.
	NewSegment(seg *Seg, size uint64, st *Stats) error
	// Map makes the whole pages [ptr, ptr+size) of seg usable. The first
	// whole bytes (a multiple of the page size, at most size) lie wholly
	// inside one block, which frees them together: a Backing may put them
	// in one physical allocation (Config.ChunkBytes). On error nothing is
	// mapped.
	Map(seg *Seg, ptr vmm.DevicePtr, size, whole uint64, st *Stats) error
	// Unmap gives back the whole pages [ptr, ptr+size) of seg; the Heap
	// has waited for the work that may touch them. It returns how many
	// bytes from ptr on it unmapped: all of them, or on error a prefix.
	Unmap(seg *Seg, ptr vmm.DevicePtr, size uint64, st *Stats) (uint64, error)
	// DropSegment gives back a segment in which nothing is mapped.
	DropSegment(seg *Seg, st *Stats) error
	// CachedBytes is the size of the unmapped physical pages of pool p the
	// Backing keeps for reuse; they count as reserved.
	CachedBytes(p Pool) uint64
	// ReleaseCache gives every cached page back to the driver.
	ReleaseCache(st *Stats) error
}

// ReleasePolicy is how the Heap applies the release threshold
// (Config.ReleaseThreshold) after a free. A Backing that needs other than
// the default (unmap whole free pages until the free mapped bytes are
// under the threshold) implements ReleasePolicer.
type ReleasePolicy struct {
	// WholeSegments: once over the threshold, give back every wholly free
	// segment at once, dropping each (for a Backing whose segment is one
	// page that cannot be mapped again at its address: fallback's plain
	// allocations). Free memory in partly used segments cannot go that
	// way, so after a release that left the free bytes over the threshold
	// the next one waits until they pass it by more than what was left:
	// not every free walks every segment.
	WholeSegments bool
}

// ReleasePolicer is implemented by a Backing with its own ReleasePolicy.
type ReleasePolicer interface {
	ReleasePolicy() ReleasePolicy
}

// Seg is a live segment (Segment is its snapshot): a range of addresses that blocks tile: for the expandable
// allocator a reserved range of one (stream, pool), for fallback one plain
// allocation. The exported fields are set by Backing.NewSegment and do not
// change afterwards.
type Seg struct {
	Stream vmm.Stream
	Pool   Pool
	// st is the (stream, pool) the segment belongs to: beside Pool, as
	// Free's warm path reads both (TestHotLayout).
	st           *state
	Base         vmm.DevicePtr
	Size         uint64
	PageSize     uint64
	StartsMapped bool
	// Data is the Backing's own state for this segment.
	Data any

	// bounds is the Backing as an AllocBounder when its physical
	// allocations may span several pages (Config.ChunkBytes); nil: every
	// page is an allocation of its own.
	bounds AllocBounder

	first  *block   // blocks in address order
	holes  []*block // unmapped blocks in address order
	mapped uint64   // bytes mapped (while paused: to map again on resume)
	// retired are runs of holes whose pages went to the page cache while
	// still mapped (retire.go), in the order retired.
	retired []retiredRun
	// chained holds the indices of the pages a chain growth mapped
	// (pack.go) that are mapped still; cycles counts, by page index, the
	// times a growth recycled such a page away (chainCycles).
	chained map[int]struct{}
	cycles  map[int]uint8
	// paused: the segment's tag is paused (pause.go): its blocks keep
	// their books, their pages are given back and not in Heap.mu.mapped.
	paused bool
}

// End is the first address after the segment.
func (s *Seg) End() vmm.DevicePtr { return s.Base.Add(s.Size) }

// PageHolder is implemented by a Backing whose page cache can hold, for
// a while, more than its bound: Config.RecyclePages unmaps the pages a
// growth needs into the cache and maps them at once, whatever the
// cache's room.
type PageHolder interface {
	// HoldPages lets the cache keep n bytes of pages beyond its bound,
	// in whichever pools, until SettlePages.
	HoldPages(n uint64)
	// SettlePages ends the hold and releases the cached pages over the
	// bound. A page that fails to release stays cached.
	SettlePages(st *Stats) error
}

// PageRetirer is implemented by a Backing that can give a page back to its
// cache while the page stays mapped where it was (CUDA lets one physical
// allocation be mapped at several addresses): under Config.RecyclePages a
// growth takes free pages of its own stream without waiting for the
// stream (retire.go), and the Heap unmaps the old addresses once no work
// queued before the free can touch them.
type PageRetirer interface {
	// RetirePages moves the whole pages [ptr, ptr+size) of seg, each a
	// physical allocation of its own, into the cache, where the next Map
	// may take them, and leaves them mapped at ptr. The Heap counts the
	// range as a hole and never uses it before UnmapRetired. It returns
	// the bytes retired from ptr on: all, or on error a prefix.
	RetirePages(seg *Seg, ptr vmm.DevicePtr, size uint64, st *Stats) (uint64, error)
	// UnmapRetired unmaps retired pages [ptr, ptr+size) of seg, whose
	// work is done. It returns the bytes unmapped from ptr on: all, or on
	// error a prefix, which the Heap tries again later.
	UnmapRetired(seg *Seg, ptr vmm.DevicePtr, size uint64, st *Stats) (uint64, error)
}

// AllocBounder is implemented by a Backing whose mapped pages may belong
// to physical allocations of several consecutive pages (Config.ChunkBytes),
// which the driver can unmap only whole. Wherever the Heap rounds a free
// range in to whole pages to unmap, it rounds it in to whole allocations
// too, so that it never asks to unmap part of one.
type AllocBounder interface {
	// AllocBounds returns the pages [first, first+n) of the physical
	// allocation that page (an index in seg) belongs to: (page, 1) for a
	// page of its own or one not mapped.
	AllocBounds(seg *Seg, page int) (first, n int)
}
