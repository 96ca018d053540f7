package core

import (
	"fmt"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// The allocation history is PyTorch's allocator trace
// (torch.cuda.memory._record_memory_history, read by _snapshot and drawn
// by memory_viz): the last events of the Heap, in a ring buffer that drops
// the oldest when full. While it is off the Heap pays one nil check an
// event.

// history is a ring buffer of events. It fills buf up to max by append,
// then overwrites from next on: the oldest event is at next.
type history struct {
	max  int
	buf  []HistoryEvent
	next int
}

func (r *history) add(e HistoryEvent) {
	if len(r.buf) < r.max {
		r.buf = append(r.buf, e)
		return
	}
	r.buf[r.next] = e
	if r.next++; r.next == r.max {
		r.next = 0
	}
}

// events returns a copy of the events, oldest first.
func (r *history) events() []HistoryEvent {
	out := make([]HistoryEvent, 0, len(r.buf))
	out = append(out, r.buf[r.next:]...)
	return append(out, r.buf[:r.next]...)
}

// resize keeps the newest max events.
func (r *history) resize(max int) {
	ev := r.events()
	r.buf, r.next, r.max = ev[len(ev)-min(len(ev), max):], 0, max
}

// RecordHistory turns the history on, keeping at most maxEntries events
// (PyTorch's max_entries): the events it holds stay, the oldest dropped if
// there are more. 0 turns it off and drops them. maxEntries outside [0,
// MaxHistoryEntries] is an error matching vmm.ErrInvalid.
func (h *Heap) RecordHistory(maxEntries int) error {
	if maxEntries < 0 || maxEntries > MaxHistoryEntries {
		return fmt.Errorf("recording a history of %d events: not in [0, %d]: %w", maxEntries, MaxHistoryEntries, vmm.ErrInvalid)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return fmt.Errorf("recording a history: %w", vmm.ErrClosed)
	}
	switch {
	case maxEntries == 0:
		h.mu.hist = nil
	case h.mu.hist == nil:
		h.mu.hist = &history{max: maxEntries}
	default:
		h.mu.hist.resize(maxEntries)
	}
	return nil
}

// History returns the recorded events, oldest first; nil while the
// history is off. It works after Close too.
func (h *Heap) History() []HistoryEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.hist == nil {
		return nil
	}
	return h.mu.hist.events()
}

// noteLocked records an event; the caller has checked that the history
// is on.
func (h *Heap) noteLocked(action string, ptr vmm.DevicePtr, size uint64, seg *Seg) {
	h.mu.hist.add(HistoryEvent{Action: action, Addr: ptr, Size: size, Stream: seg.Stream, TimeUS: time.Now().UnixMicro(), Pool: seg.st.key.private})
}

// noteOOMLocked records an OOM of a request of size bytes on stream s;
// free is the device's free memory, if known.
func (h *Heap) noteOOMLocked(size uint64, s vmm.Stream, free uint64) {
	h.mu.hist.add(HistoryEvent{Action: ActionOOM, Size: size, Stream: s, TimeUS: time.Now().UnixMicro(), DeviceFree: free})
}

// noteMapLocked records pages mapped into seg, or its plain allocation
// made.
func (h *Heap) noteMapLocked(seg *Seg, ptr vmm.DevicePtr, size uint64) {
	if seg.StartsMapped {
		h.noteLocked(ActionSegmentAlloc, ptr, size, seg)
	} else {
		h.noteLocked(ActionSegmentMap, ptr, size, seg)
	}
}

// noteUnmapLocked records pages unmapped from seg, or its plain
// allocation freed.
func (h *Heap) noteUnmapLocked(seg *Seg, ptr vmm.DevicePtr, size uint64) {
	if seg.StartsMapped {
		h.noteLocked(ActionSegmentFree, ptr, size, seg)
	} else {
		h.noteLocked(ActionSegmentUnmap, ptr, size, seg)
	}
}

// Recorder is the history half of an allocator's API (the root package's
// xseg.Historian), over a Heap. Both allocators embed it.
type Recorder struct{ h *Heap }

// NewRecorder returns the history of h.
func NewRecorder(h *Heap) Recorder { return Recorder{h: h} }

// RecordHistory keeps the last maxEntries allocator events; 0 turns it
// off and drops them.
func (r Recorder) RecordHistory(maxEntries int) error { return r.h.RecordHistory(maxEntries) }

// History returns the recorded events, oldest first.
func (r Recorder) History() []HistoryEvent { return r.h.History() }
