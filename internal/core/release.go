package core

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// EmptyCache waits for the pending frees, unmaps every whole free page,
// gives back the segments left empty and the cached physical pages, and
// destroys the allocator's idle events.
func (h *Heap) EmptyCache() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return fmt.Errorf("emptying the cache: %w", vmm.ErrClosed)
	}
	if h.capturingLocked() {
		return fmt.Errorf("emptying the cache: %w", spec.ErrCapturing)
	}
	h.settleLocked()
	err := h.waitPendingLocked(allBlocks)
	err = errors.Join(err, h.releaseAllLocked(), h.destroyEventsLocked())
	// What is held now is what stays: a growth past it claims memory
	// anew, and may take chunks again (pastChunkMarkLocked).
	h.mu.chunkMark = uint64(h.mu.stats.ReservedBytes.All.Current)
	if invariantsOn {
		h.checkLocked()
	}
	if err != nil {
		return fmt.Errorf("emptying the cache: %w", err)
	}
	return nil
}

// releaseAllLocked unmaps every whole free page of every segment, drops
// empty segments and releases the page cache. Private pools in use keep
// their pages; released ones give them back.
func (h *Heap) releaseAllLocked() error {
	var errs []error
	for _, pp := range h.mu.pools {
		if pp.uses == 0 {
			errs = append(errs, h.givePoolBackLocked(pp))
		}
	}
	for _, st := range h.mu.states {
		if !st.key.private.IsZero() {
			continue
		}
		errs = append(errs, h.releaseStateLocked(st, false))
	}
	errs = append(errs, h.releaseCacheLocked())
	return errors.Join(errs...)
}

// releaseStateLocked unmaps every whole free page of st's segments (synced:
// the caller has waited for the device) and gives back those left empty.
func (h *Heap) releaseStateLocked(st *state, synced bool) error {
	var errs []error
	h.flush(st)
	for _, seg := range slices.Clone(st.segs) {
		mode := settleWait
		if synced {
			mode = settleSynced
		}
		if err := h.settleRetiredLocked(seg, seg.Base, seg.End(), mode); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := h.unmapFreeLocked(seg, math.MaxUint64, keepOut{}, synced, false, false); err != nil {
			errs = append(errs, err)
			continue
		}
		if seg.first.state == stUnmapped && seg.first.next == nil {
			errs = append(errs, h.dropSegmentLocked(seg))
		}
	}
	return errors.Join(errs...)
}

// releaseCacheLocked releases the Backing's cached pages.
func (h *Heap) releaseCacheLocked() error {
	defer h.syncReservedLocked()
	if err := h.pageWorkLocked(func() error { return h.back.ReleaseCache(&h.mu.stats) }); err != nil {
		return fmt.Errorf("releasing cached pages: %w", err)
	}
	return nil
}

// trimLocked unmaps whole free pages while the free bytes in mapped pages
// exceed the release threshold, or as the Backing's ReleasePolicy says.
func (h *Heap) trimLocked() {
	over := h.freeMappedLocked() - int64(h.cfg.ReleaseThreshold)
	if over <= 0 {
		h.mu.trimFloor = 0
	}
	if over <= 0 || h.capturingLocked() {
		return
	}
	if h.release.WholeSegments {
		h.trimSegmentsLocked(uint64(over))
		return
	}
	for _, st := range h.mu.states {
		if !st.key.private.IsZero() {
			continue
		}
		h.flush(st)
		for _, seg := range st.segs {
			n, err := h.unmapFreeLocked(seg, uint64(over), keepOut{}, false, false, false)
			if err != nil {
				h.log.Warn("xseg: unmapping free pages above the release threshold", "err", err)
				return
			}
			if over -= int64(n); over <= 0 {
				return
			}
		}
	}
}

// trimSegmentsLocked is the release threshold under
// ReleasePolicy.WholeSegments: every wholly free segment of the shared
// pools goes back, unless the free bytes over the threshold (over) are no
// more than the last release left.
func (h *Heap) trimSegmentsLocked(over uint64) {
	if over <= h.mu.trimFloor {
		return
	}
	var errs []error
	for _, st := range h.mu.states {
		if st.key.private.IsZero() {
			errs = append(errs, h.releaseStateLocked(st, false))
		}
	}
	if err := errors.Join(errs...); err != nil {
		h.log.Warn("xseg: releasing free segments above the release threshold", "err", err)
	}
	h.mu.trimFloor = uint64(max(0, h.freeMappedLocked()-int64(h.cfg.ReleaseThreshold)))
}

// ReleaseFloor is what the last release under ReleasePolicy.WholeSegments
// left over the threshold (0 after none, or once under it again).
func (h *Heap) ReleaseFloor() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.trimFloor
}

// freeMappedLocked is the free bytes in mapped pages of the shared pools:
// those the release threshold may unmap (private pools keep theirs). The
// free blocks of a state are its mapped bytes less its active ones. A
// paused tag's segments are not in h.mu.mapped, their active blocks are
// in ActiveBytes: their books' mapped bytes make up for both.
func (h *Heap) freeMappedLocked() int64 {
	var n int64
	for _, m := range h.mu.mapped {
		n += int64(m)
	}
	n -= h.mu.bstats.allCurrent()[hActiveBytes]
	for _, pp := range h.mu.pools {
		paused := pp.paused()
		for _, st := range pp.states {
			n -= int64(st.freeBytes)
			for _, seg := range st.segs {
				if paused {
					n += int64(seg.mapped)
				}
			}
		}
	}
	return n
}

// unmapFreeLocked unmaps the whole pages inside free blocks of seg, up to
// about budget bytes, after waiting for the pending blocks of the segment
// and for the work queued on the segment's stream (unless synced: the
// caller waited for the whole device; or the blocks were all freed before
// the stream's last completed mark, idleLocked). It leaves alone what keep
// says. The exact-size lists of the segment's state must have been
// flushed. With exact it unmaps no more than budget (a multiple of the
// page size), from the top down: the highest free blocks first, and of
// the last one the pages at its top end, not the whole block (see
// unmapPassLocked). With retire (the pages go to a growth on seg's
// stream) it waits for nothing but retires the pages that may still be
// in use, where it can (retire.go).
func (h *Heap) unmapFreeLocked(seg *Seg, budget uint64, keep keepOut, synced, exact, retire bool) (uint64, error) {
	if !hasWholePage(seg, keep) {
		return 0, nil
	}
	if err := h.waitPendingLocked(func(b *block) bool { return b.seg == seg }); err != nil {
		return 0, err
	}
	h.flush(seg.st)
	if synced || h.idleLocked(seg, keep) {
		retire = false
	} else if !retire {
		if err := h.waitStreamLocked(seg); err != nil {
			return 0, err
		}
	}
	return h.unmapPassLocked(seg, budget, keep, exact, retire)
}

// waitStreamLocked waits for the work queued on seg's stream before its
// free pages are unmapped.
func (h *Heap) waitStreamLocked(seg *Seg) error {
	if err := h.waitTimedLocked(func() error { return h.syncStreamLocked(seg.Stream) }); err != nil {
		return fmt.Errorf("synchronizing stream %#x before unmapping: %w", uintptr(seg.Stream), err)
	}
	h.streamIdleLocked(seg.Stream)
	return nil
}

// idleLocked reports whether every free block of seg with pages to unmap
// was freed before the stream's last completed mark (marks.go): then no
// work can touch them and the unmap need not wait for the stream. All or
// nothing: which pages go stays the same, only the wait is spared.
func (h *Heap) idleLocked(seg *Seg, keep keepOut) bool {
	if h.capturingLocked() {
		return false
	}
	idle := h.idleBeforeLocked(seg.Stream)
	for b := seg.first; b != nil; b = b.next {
		if lo, hi := keep.pages(seg, b); hi > lo && b.freed >= idle {
			return false
		}
	}
	return true
}

// unmapPassLocked unmaps the whole pages of seg's free blocks up to about
// budget bytes (see unmapFreeLocked): all of them in address order, or
// with exact (a growth recycling pages) from the top down.
//
// Recycling takes from the top because the bottom is where the next
// blocks go: best fit and packing (pack.go) both favour low addresses,
// and a free block whose low pages are taken starts on a page boundary
// after a hole, where the next block lands and the page before the hole
// stays mapped for the free rest of it, caught between live blocks
// (generate_large's KV-cache blocks, bench/RESULTS.md round 43). Taken
// from the top, the free block keeps its start, next to the live block
// before it, where the next block continues their pages.
//
// With retire, the pages of a block freed after the stream's last
// completed mark are retired instead; where they cannot be, it waits for
// the stream first.
func (h *Heap) unmapPassLocked(seg *Seg, budget uint64, keep keepOut, exact, retire bool) (uint64, error) {
	var done uint64
	// unmapSpanLocked changes only the block it unmaps from and the holes
	// next to it, so the free blocks listed first stay valid.
	var down []*block
	if exact {
		for b := seg.first; b != nil; b = b.next {
			if lo, hi := keep.pages(seg, b); hi > lo {
				down = append(down, b)
			}
		}
	}
	b := seg.first
	for done < budget {
		if exact {
			if len(down) == 0 {
				break
			}
			b, down = down[len(down)-1], down[:len(down)-1]
		} else if b == nil {
			break
		}
		lo, hi := keep.pages(seg, b)
		if hi <= lo {
			b = b.next // exact takes its next block from down
			continue
		}
		if exact && uint64(hi-lo) > budget-done {
			// Up to a whole allocation (hi ends one, lo starts one): a
			// physical allocation larger than what is left of the budget
			// goes whole, its excess back to the driver, rather than stay
			// mapped in a free block while the heap grows elsewhere.
			l, _ := seg.allocsOut(hi.Add(-(budget - done)), hi)
			lo = max(lo, l)
		}
		r := retire && b.freed >= h.markLocked(seg.Stream).idle
		if r && !h.canRetireLocked(seg, lo, hi) {
			if err := h.waitStreamLocked(seg); err != nil {
				return done, err
			}
			retire, r = false, false
		}
		n, next, err := h.unmapSpanLocked(b, lo, hi, r, exact)
		done += n
		if err != nil {
			return done, err
		}
		b = next
	}
	return done, nil
}

// quiesceLocked waits for what may still touch seg's free block b before
// its pages are unmapped: the pending blocks of seg, and the work queued
// on its stream unless b was freed before the stream's last completed
// mark (marks.go).
func (h *Heap) quiesceLocked(seg *Seg, b *block) error {
	if err := h.waitPendingLocked(func(x *block) bool { return x.seg == seg }); err != nil {
		return err
	}
	if !h.capturingLocked() && b.freed < h.idleBeforeLocked(seg.Stream) {
		return nil
	}
	return h.waitStreamLocked(seg)
}

// keepOut is what an unmap of free pages leaves mapped: the free blocks
// in skip, and the pages that overlap [lo, hi) (none while hi <= lo).
type keepOut struct {
	skip   []*block
	lo, hi vmm.DevicePtr
}

// pages returns the whole pages of b that an unmap may take: none unless
// b is a coalesced free block not in skip; of those inside b, the ones
// above the kept range if any, else those below it.
func (k keepOut) pages(seg *Seg, b *block) (lo, hi vmm.DevicePtr) {
	if !b.isFreeIn() || slices.Contains(k.skip, b) {
		return 0, 0
	}
	lo, hi = wholePages(seg, b)
	if k.hi <= k.lo || hi <= k.lo || lo >= k.hi {
		return lo, hi
	}
	// The pages (the allocations) that overlap the kept range.
	klo, khi := seg.allocsOut(k.lo, k.hi)
	if hi > khi {
		return max(lo, khi), hi
	}
	return lo, min(hi, klo)
}

func hasWholePage(seg *Seg, keep keepOut) bool {
	for b := seg.first; b != nil; b = b.next {
		if lo, hi := keep.pages(seg, b); hi > lo {
			return true
		}
	}
	return false
}

// wholePages returns the whole pages inside b.
func wholePages(seg *Seg, b *block) (lo, hi vmm.DevicePtr) { return pagesIn(seg, b.ptr, b.size) }

// pagesIn returns the whole pages of seg inside [ptr, ptr+size), rounded
// in to whole physical allocations (AllocBounder); hi <= lo when there
// are none.
func pagesIn(seg *Seg, ptr vmm.DevicePtr, size uint64) (lo, hi vmm.DevicePtr) {
	lo = seg.Base.Add(roundUp(uint64(ptr-seg.Base), seg.PageSize))
	hi = seg.Base.Add(uint64(ptr.Add(size)-seg.Base) / seg.PageSize * seg.PageSize)
	return seg.allocsIn(lo, hi)
}

// allocsIn rounds [lo, hi), whole pages of s, in to whole physical
// allocations: an allocation that sticks out at either end is left out.
// hi <= lo when none is left.
func (s *Seg) allocsIn(lo, hi vmm.DevicePtr) (vmm.DevicePtr, vmm.DevicePtr) {
	if s.bounds == nil || hi <= lo {
		return lo, hi
	}
	ps := s.PageSize
	l, e := int(uint64(lo-s.Base)/ps), int(uint64(hi-s.Base)/ps)
	if f, n := s.bounds.AllocBounds(s, l); f < l {
		l = f + n
	}
	if e > l {
		if f, n := s.bounds.AllocBounds(s, e-1); f+n > e {
			e = f
		}
	}
	if e <= l {
		return lo, lo
	}
	return s.Base.Add(uint64(l) * ps), s.Base.Add(uint64(e) * ps)
}

// allocEdge reports whether at, a page boundary of s, is no physical
// allocation's inside.
func (s *Seg) allocEdge(at vmm.DevicePtr) bool {
	if s.bounds == nil || at <= s.Base || at >= s.End() {
		return true
	}
	i := int(uint64(at-s.Base) / s.PageSize)
	f, _ := s.bounds.AllocBounds(s, i)
	g, n := s.bounds.AllocBounds(s, i-1)
	return f == i && g+n == i
}

// allocsOut rounds [lo, hi) of s out to whole pages and whole physical
// allocations.
func (s *Seg) allocsOut(lo, hi vmm.DevicePtr) (vmm.DevicePtr, vmm.DevicePtr) {
	ps := s.PageSize
	l, e := int(uint64(lo-s.Base)/ps), int(roundUp(uint64(hi-s.Base), ps)/ps)
	if s.bounds != nil && e > l {
		l, _ = s.bounds.AllocBounds(s, l)
		f, n := s.bounds.AllocBounds(s, e-1)
		e = max(e, f+n)
	}
	return s.Base.Add(uint64(l) * ps), s.Base.Add(uint64(e) * ps)
}

// unmapSpanLocked unmaps [lo, hi), whole pages inside free block b, or
// with retire retires them (retire.go), and turns what went into a hole.
// recycled says a growth takes the pages (a chain cycle, if a chain
// growth mapped them: Seg.noteUnmapped). It returns the block after
// the hole, where a walk of the segment goes on.
func (h *Heap) unmapSpanLocked(b *block, lo, hi vmm.DevicePtr, retire, recycled bool) (uint64, *block, error) {
	seg := b.seg
	seg.st.removeFree(b)
	var n uint64
	err := h.pageWorkLocked(func() (err error) {
		if retire {
			n, err = h.retirer.RetirePages(seg, lo, uint64(hi-lo), &h.mu.stats)
		} else {
			n, err = h.back.Unmap(seg, lo, uint64(hi-lo), &h.mu.stats)
		}
		return err
	})
	if retire && n > 0 {
		h.noteRetiredLocked(seg, lo, lo.Add(n), b.freed)
	}
	next := b.next
	if n == 0 {
		seg.st.insertFree(b)
		h.syncReservedLocked()
	} else {
		h.addMappedLocked(seg, -int64(n))
		if h.mu.hist != nil {
			h.noteUnmapLocked(seg, lo, n)
		}
		if lo > b.ptr {
			m := h.splitAt(b, uint64(lo-b.ptr))
			seg.st.insertFree(b)
			b = m
		}
		if end := lo.Add(n); end < b.end() {
			t := h.splitAt(b, uint64(end-b.ptr))
			seg.st.insertFree(t)
		}
		b.cycles = seg.noteUnmapped(lo, n, recycled)
		next = h.addHole(b).next
	}
	if err != nil {
		return n, next, fmt.Errorf("unmapping %d bytes at %v: %w", hi-lo, lo, err)
	}
	return n, next, nil
}

// dropSegmentLocked gives back seg, in which nothing is mapped.
func (h *Heap) dropSegmentLocked(seg *Seg) error {
	if err := h.settleRetiredLocked(seg, seg.Base, seg.End(), settleWait); err != nil {
		return fmt.Errorf("giving back segment %v+%d: %w", seg.Base, seg.Size, err)
	}
	if err := h.back.DropSegment(seg, &h.mu.stats); err != nil {
		return fmt.Errorf("giving back segment %v+%d: %w", seg.Base, seg.Size, err)
	}
	st := seg.st
	st.segs = slices.DeleteFunc(st.segs, func(s *Seg) bool { return s == seg })
	h.recycle(seg.first)
	seg.first, seg.holes = nil, nil
	h.mu.stats.Segments.Add(seg.Pool, -1)
	return nil
}
