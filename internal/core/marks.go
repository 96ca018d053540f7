package core

import "github.com/xseg-dev/xseg/vmm"

// Stream marks let an unmap of free pages skip waiting for their stream.
//
// Before the Heap unmaps free pages it must know that no work queued on
// their stream still touches them. Waiting for the whole stream is safe
// but stalls the program's queue: a training loop that recycles pages a
// few times a step loses about 1 % of its throughput to those waits
// (bench/RESULTS.md round 17). The work that can touch a free block was
// queued before the block was freed, so the Heap numbers its frees
// (block.freed) and keeps, per stream, an event recorded on it when the
// count was seq: once that event has completed, every block freed before
// it is idle. The Heap records a new mark now and then on the slow paths
// (at most one in flight a stream) and asks the driver whether the one in
// flight is done only when it needs to know; a stream wait makes every
// block freed so far idle as well.
type streamMark struct {
	ev       vmm.Event // the mark's event; 0 when there is none
	seq      uint64    // h.mu.freeSeq when ev was recorded
	inFlight bool      // ev recorded and not yet seen complete
	idle     uint64    // blocks with freed < idle are idle
	tried    uint64    // h.mu.freeSeq when the slow path last asked the driver
}

// markEvery is how many frees pass between two marks of a stream at least.
const markEvery = 64

// idleBeforeLocked returns the free sequence number before which every
// block of stream s is idle: it checks the mark in flight and records a
// new one. A driver error leaves the answer where it was (the caller then
// waits for the stream).
func (h *Heap) idleBeforeLocked(s vmm.Stream) uint64 {
	m := h.markLocked(s)
	h.refreshMarkLocked(s, m)
	return m.idle
}

// streamIdleLocked notes that every block of stream s freed so far is
// idle: the stream was just waited for.
func (h *Heap) streamIdleLocked(s vmm.Stream) {
	m := h.markLocked(s)
	m.idle = h.mu.freeSeq + 1
}

// touchMarksLocked records a new mark on stream s when the last one has
// completed: called on the slow path of Alloc, so that a later unmap
// finds a recent mark. It asks the driver (a query, perhaps a record)
// once every markEvery frees at most, whatever the answer, so that a
// mark long in flight or a failing driver costs the slow path nothing
// in between.
func (h *Heap) touchMarksLocked(s vmm.Stream) {
	m := h.markLocked(s)
	if h.mu.freeSeq < m.tried+markEvery {
		return
	}
	m.tried = h.mu.freeSeq
	h.refreshMarkLocked(s, m)
	if len(h.mu.retiring) > 0 {
		h.sweepRetiredLocked(s)
	}
}

func (h *Heap) markLocked(s vmm.Stream) *streamMark {
	m := h.mu.marks[s]
	if m == nil {
		if h.mu.marks == nil || len(h.mu.marks) >= maxStreams {
			h.dropMarksLocked()
			h.mu.marks = make(map[vmm.Stream]*streamMark)
		}
		m = &streamMark{}
		h.mu.marks[s] = m
	}
	return m
}

// markPassedLocked asks the driver whether m's mark in flight has
// completed and, if so, takes its sequence number as idle. A failed
// question is a no.
func (h *Heap) markPassedLocked(m *streamMark) bool {
	done, err := h.drv.EventQuery(m.ev)
	if err != nil || !done {
		return false
	}
	m.inFlight = false
	m.idle = max(m.idle, m.seq)
	return true
}

// refreshMarkLocked takes the completed mark's sequence number as idle and
// records a new mark. Nothing is queried or recorded during a capture.
func (h *Heap) refreshMarkLocked(s vmm.Stream, m *streamMark) {
	if h.capturingLocked() {
		return
	}
	if m.inFlight && !h.markPassedLocked(m) {
		return
	}
	if m.ev == 0 {
		ev, err := h.eventLocked()
		if err != nil {
			return
		}
		m.ev = ev
	}
	if err := h.drv.EventRecord(m.ev, s); err != nil {
		// A stream destroyed, or a driver failure: no mark in flight;
		// the next unmap waits for the stream as it would without
		// marks. m stays in h.mu.marks (what it knows to be idle still
		// is): a caller holding it may refresh it again, and an event
		// it then records must be found by dropMarksLocked.
		h.mu.events = append(h.mu.events, m.ev)
		m.ev = 0
		return
	}
	m.seq, m.inFlight = h.mu.freeSeq+1, true
}

// dropMarksLocked gives the marks' events back to the pool (to be
// destroyed with it) and forgets the marks.
func (h *Heap) dropMarksLocked() {
	for _, m := range h.mu.marks {
		if m.ev != 0 {
			h.mu.events = append(h.mu.events, m.ev)
		}
	}
	clear(h.mu.marks)
}
