package core

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/xseg-dev/xseg/spec"
)

// Close waits for the work queued on the segments' streams, frees the
// blocks still allocated (they become invalid), unmaps every mapped page,
// gives back every segment and cached page and destroys the allocator's
// events. Every other method fails with vmm.ErrClosed after the first
// Close.
//
// If the driver fails, Close returns the error and keeps what it could not
// give back, in books that still match the driver (an unmapped prefix of a
// run is a hole, a segment whose range was not given back stays a
// segment): a later Close tries again what is left and returns the error
// again until all of it is given back. Once a Close has returned nil,
// nothing is held and later calls return nil.
func (h *Heap) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed && h.heldNothingLocked() {
		return nil
	}
	h.mu.closed = true
	h.wakeLocked()
	errs := []error{h.waitPendingLocked(allBlocks)}
	for _, p := range h.mu.pending {
		h.mu.events = append(h.mu.events, p.ev)
	}
	// Blocks still waiting for events, deferred or pinned are freed below
	// all the same: the memory goes, importers keep their own references.
	h.mu.pending, h.mu.deferred, h.mu.pins = nil, nil, nil
	h.forgetPausedLocked()
	for _, st := range h.mu.states {
		for _, seg := range slices.Clone(st.segs) {
			errs = append(errs, h.closeSegmentLocked(seg))
		}
	}
	errs = append(errs, h.releaseCacheLocked(), h.destroyEventsLocked())
	if invariantsOn {
		h.checkLocked()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing the allocator: %w", err)
	}
	return nil
}

// Closed reports whether Close has been called: from then on every other
// method fails with vmm.ErrClosed, and so should the methods of a Backing's
// allocator that do not go through the Heap (peer access).
func (h *Heap) Closed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.closed
}

// heldNothingLocked reports whether a closed Heap has given everything
// back: no segment, no cached page, no event.
func (h *Heap) heldNothingLocked() bool {
	for _, st := range h.mu.states {
		if len(st.segs) > 0 {
			return false
		}
	}
	for _, p := range spec.Pools() {
		if h.back.CachedBytes(p) != 0 {
			return false
		}
	}
	return len(h.mu.events) == 0
}

// closeSegmentLocked frees every block of seg, unmaps its mapped pages and
// gives it back. Through the same path as EmptyCache, a failure leaves
// the books right: what was unmapped is a hole, the rest stays free and
// mapped, and the segment stays until it is empty and given back.
func (h *Heap) closeSegmentLocked(seg *Seg) error {
	var errs []error
	if err := h.waitTimedLocked(func() error { return h.syncStreamLocked(seg.Stream) }); err != nil {
		errs = append(errs, fmt.Errorf("synchronizing stream %#x: %w", uintptr(seg.Stream), err))
	}
	h.freeAllLocked(seg)
	h.flush(seg.st)
	if err := h.settleRetiredLocked(seg, seg.Base, seg.End(), settleSynced); err != nil {
		errs = append(errs, err)
	}
	if _, err := h.unmapFreeLocked(seg, math.MaxUint64, keepOut{}, true, false, false); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if seg.first.state == stUnmapped && seg.first.next == nil {
		errs = append(errs, h.dropSegmentLocked(seg))
	}
	return errors.Join(errs...)
}

// freeAllLocked makes every allocated or pending block of seg free, without
// waiting for streams: Close has said the memory is dead.
func (h *Heap) freeAllLocked(seg *Seg) {
	var live []*block
	for b := seg.first; b != nil; b = b.next {
		if b.state == stAllocated || b.state == stPending {
			live = append(live, b)
		}
	}
	// Blocks not yet freed are never merged away, so each is still live
	// when its turn comes.
	// These frees are not the program's: the history records none of
	// them, only the segments given back.
	hist := h.mu.hist
	h.mu.hist = nil
	for _, b := range live {
		if b.state == stAllocated {
			h.unallocateLocked(b)
		}
		b.uses, b.events, b.deferred = b.uses[:0], 0, false
		h.deactivateLocked(b)
	}
	h.mu.hist = hist
}
