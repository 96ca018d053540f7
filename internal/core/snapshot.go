package core

import (
	"cmp"
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// Snapshot returns the segments, their mapped ranges and their blocks (not
// the unmapped holes), and the statistics.
func (h *Heap) Snapshot() Snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	var snap Snapshot
	for _, st := range h.mu.states {
		for _, seg := range st.segs {
			snap.Segments = append(snap.Segments, h.segmentSnapshot(seg))
		}
	}
	slices.SortFunc(snap.Segments, func(a, b Segment) int { return cmp.Compare(a.Base, b.Base) })
	snap.Stats = h.statsLocked()
	return snap
}

func (h *Heap) segmentSnapshot(seg *Seg) Segment {
	s := Segment{Device: h.dev, Stream: seg.Stream, Pool: seg.Pool.String(), PrivatePool: seg.st.key.private, Base: seg.Base, Reserved: seg.Size, PageSize: seg.PageSize}
	if !seg.paused { // a paused tag's blocks keep their books, not their pages
		mappedRuns(seg, func(ptr vmm.DevicePtr, size uint64) {
			s.Mapped = append(s.Mapped, Range{Ptr: ptr, Size: size})
		})
	}
	for b := seg.first; b != nil; b = b.next {
		var state BlockState
		switch b.state {
		case stUnmapped:
			continue
		case stAllocated:
			state = BlockAllocated
		case stPending:
			state = BlockPending
		default:
			state = BlockFree
		}
		s.Blocks = append(s.Blocks, Block{Ptr: b.ptr, Size: b.size, Requested: b.requested, State: state})
	}
	return s
}
