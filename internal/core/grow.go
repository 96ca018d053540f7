package core

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// findLocked finds room for rs bytes in st without the OOM policy: best
// fit among the coalesced free blocks, then new pages.
func (h *Heap) findLocked(st *state, rs uint64) (*block, error) {
	h.flush(st)
	for {
		b := st.bestFit(rs)
		if b == nil {
			break
		}
		if h.bounds == nil || !h.splitChunkLocked(b, rs) {
			return b, nil
		}
	}
	return h.growLocked(st, rs)
}

// splitChunkLocked keeps a physical allocation of several pages (a chunk,
// Config.ChunkBytes) from being shared by a block and free memory, where
// no page of it could be unmapped or recycled until the block is freed:
// if the block of rs bytes about to be carved from the start of free
// block b would end inside a chunk that goes on past the page the block
// ends in, it unmaps that chunk (waiting for the work that may touch it,
// as any unmap of free pages does) and reports true; the caller looks for
// room again, and the growth into the hole backs the block with pages
// and chunks of its own. b is out of the free structures; it stays so
// when nothing is unmapped. Nothing is split while a pool is active or in
// a private pool (a capture forbids the wait; a graph addresses the
// pages), nor by a Heap that never moves free pages (no recycling and
// no page cache to steal into, SteadyConfig): there a split would buy
// nothing, the free pages staying where they are either way, and each
// chunk would be made again page by page.
func (h *Heap) splitChunkLocked(b *block, rs uint64) bool {
	if h.pagesStayPut() {
		return false
	}
	lo, hi, ok := h.chunkToSplit(b, rs)
	if !ok {
		return false
	}
	seg := b.seg
	b.seg.st.insertFree(b)
	if err := h.quiesceLocked(seg, b); err != nil {
		h.log.Warn("xseg: waiting before splitting a physical allocation", "err", err)
		b.seg.st.removeFree(b)
		return false
	}
	n64, _, err := h.unmapSpanLocked(b, lo, hi, false, false)
	if err != nil {
		h.log.Warn("xseg: unmapping a physical allocation to split it", "err", err)
	}
	if n64 == 0 {
		// Take b out again for the caller, as bestFit did.
		b.seg.st.removeFree(b)
		return false
	}
	return true
}

// chunkToSplit is the chunk splitChunkLocked would unmap for a block of
// rs bytes carved from the start of free block b, if any.
func (h *Heap) chunkToSplit(b *block, rs uint64) (lo, hi vmm.DevicePtr, ok bool) {
	seg := b.seg
	end := b.ptr.Add(rs)
	if end >= b.end() || h.capturingLocked() || !seg.st.key.private.IsZero() {
		return 0, 0, false
	}
	lo, hi, past := seg.endAlloc(end)
	if !past || lo < b.ptr || hi > b.end() {
		return 0, 0, false
	}
	return lo, hi, true
}

// growLocked maps new pages for rs bytes: at the lowest hole of st's
// segments that, with the free blocks around it, fits, or in a new segment.
func (h *Heap) growLocked(st *state, rs uint64) (*block, error) {
	hole := findHole(st, rs)
	if hole == nil {
		seg, err := h.newSegmentLocked(st, rs)
		if err != nil {
			return nil, err
		}
		if seg.StartsMapped {
			b := seg.first
			st.removeFree(b)
			return b, nil
		}
		hole = seg.first
	}
	return h.growIntoLocked(st, hole, nil, rs)
}

// growIntoLocked grows into hole for rs bytes, the block starting at the
// free block before it (chainHoleLocked's chain) if chain is not nil.
func (h *Heap) growIntoLocked(st *state, hole, chain *block, rs uint64) (*block, error) {
	// Under Config.RecyclePages the growth stays in its hole, which the
	// stealing kept (it leaves the pages the block will cover mapped; a
	// hole it opens next to this one merges into it): the pages it
	// unmapped are what that hole needs, and a lower hole the stealing
	// opened would take more.
	if h.stealLocked(hole, rs) && (h.holder == nil || hole.state != stUnmapped) {
		// The stealing kept the chain's free block and the pages the
		// block will cover: the hole after it is where the block grows.
		if chain != nil && chain.isFreeIn() && chain.next != nil && chain.next.state == stUnmapped {
			hole = chain.next
		} else if hole = findHole(st, rs); hole == nil {
			panic("core: the hole to grow into vanished")
		}
	}
	// The books of chain cycles are kept only where they are read.
	b, err := h.mapIntoLocked(hole, rs, chain != nil && h.cfg.SettleChains)
	if h.holder != nil {
		if serr := h.pageWorkLocked(func() error { return h.holder.SettlePages(&h.mu.stats) }); serr != nil {
			h.log.Warn("xseg: releasing recycled pages the growth did not use", "err", serr)
		}
		h.syncReservedLocked()
	}
	return b, err
}

// stealLocked unmaps whole free pages of hole's (stream, pool) elsewhere,
// into the Backing's page cache, so that growing into hole for rs bytes reuses them
// instead of making new ones: a free page in the middle of a segment is
// worth nothing while the segment grows at its end. It reports whether
// it unmapped anything.
//
// It steals nothing while a pool is active (unmapping waits for streams,
// which is illegal during stream capture) and nothing in a private pool
// (a graph still addresses its free pages).
func (h *Heap) stealLocked(hole *block, rs uint64) bool {
	seg := hole.seg
	if h.capturingLocked() || !seg.st.key.private.IsZero() || h.pagesStayPut() {
		return false
	}
	_, size := h.growSpan(hole, rs)
	room := h.cfg.PageCacheBytes - min(h.cfg.PageCacheBytes, h.back.CachedBytes(seg.Pool))
	if h.holder != nil {
		// Config.RecyclePages: what the cache lacks, whatever its room.
		size -= min(size, h.usableCachedLocked(seg.Pool))
		room = size
	}
	budget := min(size, room) / seg.PageSize * seg.PageSize
	if budget == 0 {
		return false
	}
	if h.holder != nil {
		h.holder.HoldPages(budget)
	}
	keep := keepOut{skip: []*block{hole.prev, hole.next}}
	if h.holder != nil {
		// Only the pages the grown block will cover stay: the free
		// block after the hole may give its pages past the block's end.
		start := growStart(hole)
		keep = keepOut{lo: start, hi: start.Add(rs)}
	}
	var got uint64
	for _, st := range h.donorsLocked(seg) {
		h.flush(st) // coalesce its exact-size lists: whole pages show only then
		for _, s := range st.segs {
			// Pages of the growth's own stream need no wait (retire.go).
			n, err := h.unmapFreeLocked(s, budget-got, keep, false, h.holder != nil, s.Stream == seg.Stream)
			if got += n; err != nil {
				h.log.Warn("xseg: unmapping free pages for reuse", "err", err)
				return got > 0
			}
			if got >= budget {
				return true
			}
		}
	}
	return got > 0
}

// pagesStayPut reports whether the Heap never moves a free page: no
// recycling (Config.RecyclePages) and no page cache for a growth to take
// free pages into (SteadyConfig). Then nothing is stolen and no chunk is
// split; free pages go back only to the driver (EmptyCache, the release
// threshold, the OOM policy).
func (h *Heap) pagesStayPut() bool { return h.holder == nil && h.cfg.PageCacheBytes == 0 }

// usableCachedLocked is the cached bytes a growth of pool p can map: its
// own pool's and its page mates'.
func (h *Heap) usableCachedLocked(p Pool) uint64 {
	n := h.back.CachedBytes(p)
	for _, q := range h.mates[p] {
		n += h.back.CachedBytes(q)
	}
	return n
}

// donorsLocked are the states whose free pages a growth of seg may take:
// seg's own, then those of the smaller shared pools of its stream whose
// pages are the same size (Config.PageMates; a physical page fits any
// address range of its size, and the Backing hands a cached page to
// whichever pool asks). Never a larger pool's: the two would take pages
// back and forth. In pool order, so that a replay is the same every time.
//
// Under Config.RecyclePages the same pools of the other streams follow,
// by stream: their free pages are idle once their stream's work is done,
// which unmapFreeLocked waits for.
func (h *Heap) donorsLocked(seg *Seg) []*state {
	donors := []*state{seg.st}
	// Config.SizeClasses: the pool's other classes come first, then
	// the donor pools' (each pool has class 0 only without it).
	var buf [NumPools]Pool
	for _, p := range append(append(buf[:0], seg.Pool), h.donors[seg.Pool]...) {
		for c := range h.numClassesOf(p) {
			k := stateKey{stream: seg.Stream, pool: p, class: c}
			if st := h.mu.states[k]; st != nil && st != seg.st {
				donors = append(donors, st)
			}
		}
	}
	if h.holder == nil {
		return donors
	}
	for _, st := range h.mu.shared { // in donorOrder
		if k := st.key; k.stream != seg.Stream && (k.pool == seg.Pool || slices.Contains(h.donors[seg.Pool], k.pool)) {
			donors = append(donors, st)
		}
	}
	return donors
}

// donorOrder orders the states of other streams a growth takes free pages
// from: by stream, then pool from the largest down, then class.
func donorOrder(a, b *state) int {
	return cmp.Or(cmp.Compare(a.key.stream, b.key.stream), cmp.Compare(b.key.pool, a.key.pool), cmp.Compare(a.key.class, b.key.class))
}

// growSpan returns where the new pages for a block of rs bytes growing
// into hole start and how many bytes they take.
func (h *Heap) growSpan(hole *block, rs uint64) (vmm.DevicePtr, uint64) {
	seg := hole.seg
	start := growStart(hole)
	end := start.Add(rs)
	if end <= hole.ptr {
		end = hole.ptr.Add(1)
	}
	off := roundUp(uint64(end-seg.Base), seg.PageSize)
	return hole.ptr, min(uint64(seg.Base)+off-uint64(hole.ptr), hole.size)
}

// growStart is where a block growing into hole starts: at the free block
// before the hole, or at the hole.
func growStart(hole *block) vmm.DevicePtr {
	if hole.prev.isFreeIn() {
		return hole.prev.ptr
	}
	return hole.ptr
}

// fitsHole reports whether a block of rs bytes growing into hole fits
// there: in the hole with the free blocks around it, and not ending
// inside a physical allocation of the free block after the hole that
// goes on past the page it ends in. Such a block would share that chunk
// with free memory, whose pages could then be neither unmapped nor
// recycled until the block is freed (splitChunkLocked keeps best fit from
// doing the same).
func fitsHole(hole *block, rs uint64) bool {
	start := growStart(hole)
	if start.Add(rs) <= hole.end() {
		return true
	}
	next := hole.next
	if !next.isFreeIn() || start.Add(rs) > next.end() {
		return false
	}
	_, _, past := hole.seg.endAlloc(start.Add(rs))
	return !past
}

// endAlloc returns the physical allocation [lo, hi) that holds the page a
// block ending at end (inside the mapped pages of s) ends in, and whether
// it goes on past that page: a chunk the block would share with whatever
// follows it. Without AllocBounds every page is its own allocation.
func (s *Seg) endAlloc(end vmm.DevicePtr) (lo, hi vmm.DevicePtr, past bool) {
	ps := s.PageSize
	last := int(uint64(end-1-s.Base) / ps)
	f, n := last, 1
	if s.bounds != nil {
		f, n = s.bounds.AllocBounds(s, last)
	}
	return s.Base.Add(uint64(f) * ps), s.Base.Add(uint64(f+n) * ps), f+n > last+1
}

func findHole(st *state, rs uint64) *block {
	for _, seg := range st.segs {
		for _, hole := range seg.holes {
			if fitsHole(hole, rs) {
				return hole
			}
		}
	}
	return nil
}

// mapIntoLocked maps the pages of hole that a block of rs bytes starting
// at the free block before the hole (or at the hole) needs, and returns
// that free block, merged, in no free structure; chained says a chain
// growth maps them (pack.go).
func (h *Heap) mapIntoLocked(hole *block, rs uint64, chained bool) (*block, error) {
	seg := hole.seg
	_, size := h.growSpan(hole, rs)
	// Cached pages are reserved already: only new ones count against the
	// memory limit.
	if err := h.limitLocked(size - min(size, h.back.CachedBytes(seg.Pool))); err != nil {
		return nil, fmt.Errorf("mapping %d bytes at %v: %w", size, hole.ptr, err)
	}
	// The pages before the one the block ends in are the block's alone;
	// at the segment's frontier (nothing mapped past the hole) they may
	// be one physical allocation. A hole inside the segment was opened by
	// unmapping free pages, where sizes have turned over: it gets pages.
	// So does a growth that stays within what the Heap has held since its
	// last EmptyCache (the chunk mark): memory it held before and gave
	// back was given back by a split or by recycling, where sizes turned
	// over too; a chunk there would be split again, and a training loop
	// would pay a split and a new chunk every step.
	var whole uint64
	if hole.next == nil && h.pastChunkMarkLocked(seg, size) {
		whole = min(size, uint64(max(0, int64(growStart(hole).Add(rs)-hole.ptr)))/seg.PageSize*seg.PageSize)
	}
	// Pages retired from these addresses are unmapped first.
	if err := h.settleRetiredLocked(seg, hole.ptr, hole.ptr.Add(size), settleWait); err != nil {
		return nil, fmt.Errorf("mapping %d bytes at %v: %w", size, hole.ptr, err)
	}
	if err := h.pageWorkLocked(func() error { return h.back.Map(seg, hole.ptr, size, whole, &h.mu.stats) }); err != nil {
		h.syncReservedLocked() // the pages it took went back to the cache
		return nil, fmt.Errorf("mapping %d bytes at %v: %w", size, hole.ptr, err)
	}
	h.addMappedLocked(seg, int64(size))
	if h.mu.hist != nil {
		h.noteMapLocked(seg, hole.ptr, size)
	}
	if size < hole.size {
		h.splitAt(hole, size)
		seg.holes[holeIndex(seg, hole)] = hole.next
	} else {
		h.removeHole(hole)
	}
	seg.noteMapped(hole.ptr, size, chained)
	hole.state = stFree
	hole.freed = 0 // fresh pages: no work has touched them
	hole.cycles = 0
	h.mu.blocks[hole.ptr] = hole
	b := h.coalesce(hole)
	b.seg.st.removeFree(b)
	return b, nil
}

func holeIndex(seg *Seg, hole *block) int {
	for i, x := range seg.holes {
		if x == hole {
			return i
		}
	}
	panic("core: hole not in its segment's list")
}

func roundUp(n, unit uint64) uint64 { return (n + unit - 1) / unit * unit }

// addMappedLocked counts n more bytes mapped in seg (negative: unmapped)
// and brings the reserved-bytes statistics up to date.
func (h *Heap) addMappedLocked(seg *Seg, n int64) {
	seg.mapped = uint64(int64(seg.mapped) + n)
	h.mu.mapped[seg.Pool] = uint64(int64(h.mu.mapped[seg.Pool]) + n)
	h.syncReservedLocked()
}

// pastChunkMarkLocked reports whether mapping size bytes into seg takes
// the Heap past its chunk mark: whether the pages the cache cannot give
// bring the reserved bytes over the most it has reserved since it was
// made or last emptied (EmptyCache). Only chunks (Config.ChunkBytes) ask.
func (h *Heap) pastChunkMarkLocked(seg *Seg, size uint64) bool {
	if h.bounds == nil {
		return false
	}
	fresh := size - min(size, h.usableCachedLocked(seg.Pool))
	return fresh > 0 && uint64(h.mu.stats.ReservedBytes.All.Current)+fresh > h.mu.chunkMark
}

// syncReservedLocked sets ReservedBytes to the mapped bytes plus the pages
// the Backing caches, per pool.
func (h *Heap) syncReservedLocked() {
	for _, p := range spec.Pools() {
		want := int64(h.mu.mapped[p] + h.back.CachedBytes(p))
		if cur := h.mu.stats.ReservedBytes.Of(p).Current; want != cur {
			h.mu.stats.ReservedBytes.Add(p, want-cur)
		}
	}
	h.mu.chunkMark = max(h.mu.chunkMark, uint64(h.mu.stats.ReservedBytes.All.Current))
}

// newSegmentLocked asks the Backing for a segment of st that holds at
// least rs bytes: a Backing whose segments start mapped (SegmentSizer)
// sizes it itself, one that maps on demand reserves what
// reservationLocked asks for.
func (h *Heap) newSegmentLocked(st *state, rs uint64) (*Seg, error) {
	seg := &Seg{Stream: st.key.stream, Pool: st.key.pool, st: st, bounds: h.bounds}
	size := rs
	if sz, ok := h.back.(SegmentSizer); ok {
		if err := h.limitLocked(sz.SegmentBytes(st.key.pool, rs)); err != nil {
			return nil, fmt.Errorf("making a %s segment for %d bytes on stream %#x: %w", st.key.pool, rs, uintptr(st.key.stream), err)
		}
	} else {
		size = h.reservationLocked(st, rs)
	}
	if err := h.back.NewSegment(seg, size, &h.mu.stats); err != nil {
		return nil, fmt.Errorf("making a %s segment for %d bytes on stream %#x: %w", st.key.pool, rs, uintptr(st.key.stream), err)
	}
	b := h.newBlock()
	b.ptr, b.size, b.seg = seg.Base, seg.Size, seg
	seg.first = b
	if seg.StartsMapped {
		b.state = stFree
		h.mu.blocks[b.ptr] = b
		st.insertFree(b)
		h.addMappedLocked(seg, int64(seg.Size))
		if h.mu.hist != nil {
			h.noteMapLocked(seg, seg.Base, seg.Size)
		}
	} else {
		b.state = stUnmapped
		seg.holes = append(seg.holes, b)
	}
	st.segs = append(st.segs, seg)
	h.mu.stats.Segments.Add(st.key.pool, 1)
	return seg, nil
}

// minReservation is the least address space a segment of a stream other
// than the default one reserves.
const minReservation = 1 << 30

// reservationLocked is the address space a new segment of st reserves for
// a request of rs bytes. The default stream's shared pools, which hold
// most memory in most programs, reserve the device's whole memory: one
// segment that never fills, so blocks never stop at a segment's end (the
// replays' peaks depend on it); under Config.SizeClasses each class's
// range does, address space being cheap beside a split range. Any other (stream, pool) reserves in
// proportion to need: 8 times the request, at least 1 GiB, and twice its
// largest segment when it has one, so that a state needs a few segments
// at most however far it grows; never more than the device's memory.
// Reserving the whole device for every stream ran out of address space
// (128 TiB on x86-64) near a thousand streams, with memory to spare.
func (h *Heap) reservationLocked(st *state, rs uint64) uint64 {
	if st.key.stream == 0 && st.key.private.IsZero() {
		return max(h.limit, rs)
	}
	want := uint64(minReservation)
	if rs <= h.limit/8 {
		want = max(want, 8*rs)
	} else {
		want = h.limit
	}
	for _, seg := range st.segs {
		want = max(want, min(seg.Size, h.limit)*2)
	}
	return max(rs, min(want, h.limit))
}

// mappedRuns calls f for each run of mapped pages of seg, in address order.
func mappedRuns(seg *Seg, f func(ptr vmm.DevicePtr, size uint64)) {
	var start vmm.DevicePtr
	var run uint64
	for b := seg.first; b != nil; b = b.next {
		if b.state == stUnmapped {
			if run > 0 {
				f(start, run)
			}
			run = 0
			continue
		}
		if run == 0 {
			start = b.ptr
		}
		run += b.size
	}
	if run > 0 {
		f(start, run)
	}
}
