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
// and makes it pending. A stream destroyed since it used b holds it back no
// longer (see streamGoneLocked); when every such stream is gone, b stays
// allocated, for the caller to free at once. On error nothing changes: b
// stays allocated with its uses.
func (h *Heap) parkLocked(b *block) error {
	mark := len(h.mu.pending)
	gone := false
	for _, s := range b.uses {
		ev, dead, err := h.recordLocked(s)
		if dead {
			gone = true
			continue
		}
		if err != nil {
			h.unparkLocked(mark)
			return fmt.Errorf("freeing %v: recording an event on stream %#x: %w", b.ptr, uintptr(s), err)
		}
		h.mu.pending = append(h.mu.pending, pendingEvent{ev, b})
	}
	if gone {
		if err := h.streamGoneLocked(); err != nil {
			h.unparkLocked(mark)
			return fmt.Errorf("freeing %v: %w", b.ptr, err)
		}
	}
	b.events = len(h.mu.pending) - mark
	b.uses = b.uses[:0]
	if b.events > 0 {
		b.state = stPending
	}
	return nil
}

// recordLocked records an event on s. dead reports that the driver does
// not know s (vmm.ErrInvalid): the stream was destroyed.
func (h *Heap) recordLocked(s vmm.Stream) (ev vmm.Event, dead bool, err error) {
	if ev, err = h.eventLocked(); err != nil {
		return 0, false, err
	}
	if err = h.drv.EventRecord(ev, s); err != nil {
		h.mu.events = append(h.mu.events, ev)
		if errors.Is(err, vmm.ErrInvalid) {
			h.forgetStreamLocked(s)
			return 0, true, err
		}
		return 0, false, err
	}
	return ev, false, nil
}

// unparkLocked takes back the events parkLocked recorded from mark on.
func (h *Heap) unparkLocked(mark int) {
	for _, p := range h.mu.pending[mark:] {
		h.mu.events = append(h.mu.events, p.ev)
	}
	clear(h.mu.pending[mark:])
	h.mu.pending = h.mu.pending[:mark]
}

// streamGoneLocked makes sure the work of a destroyed stream is done. CUDA
// destroys a stream with work still queued once that work completes, and no
// event can be recorded on it or wait for it any more: waiting for the
// whole device covers it. It is rare (a block used on a stream destroyed
// before the block was freed), so the cost of the wider wait does not matter;
// failing instead would make the block, or the cache, unfreeable forever.
func (h *Heap) streamGoneLocked() error {
	if err := h.waitTimedLocked(func() error { return h.drv.DeviceSynchronize(h.dev) }); err != nil {
		return fmt.Errorf("waiting for the device after a stream was destroyed: %w", err)
	}
	return nil
}

// syncStreamLocked waits for the work queued on s; for a stream destroyed
// since, for the device (streamGoneLocked).
func (h *Heap) syncStreamLocked(s vmm.Stream) error {
	err := h.drv.StreamSynchronize(s)
	if s == 0 || !errors.Is(err, vmm.ErrInvalid) {
		return err
	}
	h.forgetStreamLocked(s)
	return h.streamGoneLocked()
}

// maxStreams bounds the streams checkStreamLocked remembers: a program
// that makes and destroys streams without end would grow the set forever.
// Past it the set starts afresh, at the cost of one more check a stream.
const maxStreams = 4096

// checkStreamLocked fails with an error matching vmm.ErrInvalid unless s
// is a live stream of the Heap's device (the driver's refusal says which
// it is not): Alloc and RecordStream refuse a stream that is not,
// since a block used on it could never be waited for. The driver is asked
// once a stream, by recording an idle event on it (which does not wait);
// the answer is kept until the stream is found destroyed. The default
// stream is always live. While a pool is active nothing is recorded
// (illegal during a capture) and nothing is checked.
func (h *Heap) checkStreamLocked(s vmm.Stream) error {
	if s == 0 {
		return nil
	}
	if _, ok := h.mu.streams[s]; ok {
		h.mu.lastStream = s
		return nil
	}
	if h.capturingLocked() {
		return nil
	}
	ev, err := h.eventLocked()
	if err != nil {
		return fmt.Errorf("checking stream %#x: %w", uintptr(s), err)
	}
	err = h.drv.EventRecord(ev, s)
	h.mu.events = append(h.mu.events, ev)
	if err != nil {
		return fmt.Errorf("stream %#x cannot be used on device %d: %w", uintptr(s), h.dev, err)
	}
	if h.mu.streams == nil || len(h.mu.streams) >= maxStreams {
		h.mu.streams = make(map[vmm.Stream]struct{})
	}
	h.mu.streams[s] = struct{}{}
	h.mu.lastStream = s
	return nil
}

// forgetStreamLocked drops s, found destroyed, from the checked streams:
// the next Alloc on it asks the driver again.
func (h *Heap) forgetStreamLocked(s vmm.Stream) {
	delete(h.mu.streams, s)
	if h.mu.lastStream == s {
		h.mu.lastStream = 0
	}
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
		if err := h.waitTimedLocked(func() error { return h.drv.EventSynchronize(p.ev) }); err != nil {
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

// destroyEventsLocked destroys the pooled events and the streams' marks.
func (h *Heap) destroyEventsLocked() error {
	h.dropMarksLocked()
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
