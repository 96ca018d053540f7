package core

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// pendingEvent is an event recorded, at Free, on a stream that used block b.
type pendingEvent struct {
	ev vmm.Event
	b  *block
}

// eventLocked returns an event for recording: a completed one from the
// pool, or a new one.
func (h *Heap) eventLocked() (vmm.Event, error) {
	if n := len(h.mu.events); n > 0 {
		ev := h.mu.events[n-1]
		h.mu.events = h.mu.events[:n-1]
		return ev, nil
	}
	return h.drv.EventCreate(h.dev)
}

// parkLocked records an event on each stream that used allocated block b
// and makes it pending. On error nothing changes: b stays allocated.
func (h *Heap) parkLocked(b *block) error {
	mark := len(h.mu.pending)
	for _, s := range b.uses {
		ev, err := h.eventLocked()
		if err == nil {
			if err = h.drv.EventRecord(ev, s); err != nil {
				h.mu.events = append(h.mu.events, ev)
			}
		}
		if err != nil {
			for _, p := range h.mu.pending[mark:] {
				h.mu.events = append(h.mu.events, p.ev)
			}
			clear(h.mu.pending[mark:])
			h.mu.pending = h.mu.pending[:mark]
			return fmt.Errorf("freeing %v: recording an event on stream %#x: %w", b.ptr, uintptr(s), err)
		}
		h.mu.pending = append(h.mu.pending, pendingEvent{ev, b})
	}
	b.events = len(b.uses)
	b.uses = b.uses[:0]
	b.state = stPending
	return nil
}

// pollLocked frees the pending blocks whose events have all completed.
// It queries nothing while a pool is active (illegal during capture).
func (h *Heap) pollLocked() {
	if h.capturingLocked() {
		return
	}
	keep := h.mu.pending[:0]
	for _, p := range h.mu.pending {
		done, err := h.drv.EventQuery(p.ev)
		if err != nil {
			h.log.Warn("xseg: querying an event of a freed block", "ptr", p.b.ptr, "err", err)
		}
		if !done {
			keep = append(keep, p)
			continue
		}
		h.eventDoneLocked(p)
	}
	clear(h.mu.pending[len(keep):])
	h.mu.pending = keep
}

func (h *Heap) eventDoneLocked(p pendingEvent) {
	h.mu.events = append(h.mu.events, p.ev)
	p.b.events--
	if p.b.events == 0 && !h.keepPinnedLocked(p.b) {
		h.deactivateLocked(p.b)
	}
}

// waitPendingLocked waits for the pending events of the blocks that match
// and frees the blocks whose events have all completed.
func (h *Heap) waitPendingLocked(match func(*block) bool) error {
	var errs []error
	keep := h.mu.pending[:0]
	for _, p := range h.mu.pending {
		if !match(p.b) {
			keep = append(keep, p)
			continue
		}
		h.mu.stats.Syncs++
		if err := h.drv.EventSynchronize(p.ev); err != nil {
			errs = append(errs, fmt.Errorf("waiting for an event of freed block %v: %w", p.b.ptr, err))
			keep = append(keep, p)
			continue
		}
		h.eventDoneLocked(p)
	}
	clear(h.mu.pending[len(keep):])
	h.mu.pending = keep
	return errors.Join(errs...)
}

// destroyEventsLocked destroys the pooled events.
func (h *Heap) destroyEventsLocked() error {
	var errs []error
	for _, ev := range h.mu.events {
		if err := h.drv.EventDestroy(ev); err != nil {
			errs = append(errs, fmt.Errorf("destroying event %#x: %w", uintptr(ev), err))
		}
	}
	clear(h.mu.events)
	h.mu.events = h.mu.events[:0]
	return errors.Join(errs...)
}

func allBlocks(*block) bool { return true }
