package core

import (
	"errors"
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// Close waits for the work queued on the segments' streams, unmaps every
// mapped page, gives back every segment and cached page and destroys the
// allocator's events. Blocks still allocated become invalid. A second
// Close returns nil; every other method fails with vmm.ErrClosed after it.
func (h *Heap) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return nil
	}
	h.mu.closed = true
	if h.mu.freed != nil {
		close(h.mu.freed)
		h.mu.freed = nil
	}
	errs := []error{h.waitPendingLocked(allBlocks)}
	for _, p := range h.mu.pending {
		h.mu.events = append(h.mu.events, p.ev)
	}
	h.mu.pending = nil
	for _, st := range h.mu.states {
		for _, seg := range slices.Clone(st.segs) {
			errs = append(errs, h.closeSegmentLocked(seg))
		}
	}
	if err := h.back.ReleaseCache(&h.mu.stats); err != nil {
		errs = append(errs, fmt.Errorf("releasing cached pages: %w", err))
	}
	errs = append(errs, h.destroyEventsLocked())
	clear(h.mu.blocks)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing the allocator: %w", err)
	}
	return nil
}

// closeSegmentLocked unmaps every mapped run of seg and gives it back.
func (h *Heap) closeSegmentLocked(seg *Seg) error {
	var errs []error
	h.mu.stats.Syncs++
	if err := h.drv.StreamSynchronize(seg.Stream); err != nil {
		errs = append(errs, fmt.Errorf("synchronizing stream %#x: %w", uintptr(seg.Stream), err))
	}
	mappedRuns(seg, func(ptr vmm.DevicePtr, size uint64) {
		n, err := h.back.Unmap(seg, ptr, size, &h.mu.stats)
		h.addMappedLocked(seg, -int64(n))
		if h.mu.hist != nil && n > 0 {
			h.noteUnmapLocked(seg, ptr, n)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("unmapping %d bytes at %v: %w", size, ptr, err))
		}
	})
	if seg.mapped > 0 {
		return errors.Join(errs...)
	}
	return errors.Join(append(errs, h.dropSegmentLocked(seg))...)
}
