package fallback

import (
	"fmt"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
)

// segments is the core.Backing of the fallback allocator: every segment is
// one plain allocation (vmm.Driver.MemAlloc), usable from the start and its
// own single page, so the block core unmaps it only when it is wholly
// free, and then gives it back at once. The Heap calls it with its lock
// held, so it has no lock of its own.
//
// The state machine of a segment is short: none -> allocated (NewSegment,
// MemAlloc) -> none (Unmap, MemFree; DropSegment then only forgets it).
// Nothing is kept for reuse: CachedBytes is always 0.
type segments struct {
	d   vmm.Driver
	dev vmm.Device
	cfg core.Config
}

var _ core.Backing = (*segments)(nil)

// ReleasePolicy: the release threshold gives back whole free segments
// (a freed plain allocation cannot be mapped again at its address).
func (s *segments) ReleasePolicy() core.ReleasePolicy {
	return core.ReleasePolicy{WholeSegments: true}
}

var _ core.ReleasePolicer = (*segments)(nil)

// SegmentSize is the size of the segment the fallback allocator makes for
// a request of size bytes that no cached block can serve, as PyTorch's
// native allocator sizes them: a request below half of its pool's page
// size shares a segment of that size (small requests, up to cfg.SmallLimit
// = 1 MiB by default, a 2 MiB one; large ones below 10 MiB a 20 MiB one);
// a larger one gets a segment of its own, rounded up to the first pool's
// page size (2 MiB). cfg is read as New reads it: xseg.DefaultConfig gives
// the sizes above too.
func SegmentSize(cfg Config, size uint64) uint64 {
	cfg = effectiveConfig(cfg)
	rs := core.RoundSize(size)
	return segmentSize(cfg, cfg.PoolOf(rs), rs)
}

func segmentSize(cfg core.Config, pool core.Pool, size uint64) uint64 {
	if ps := cfg.PageSize(pool); size < ps/2 {
		return ps
	}
	return roundUp(size, cfg.PoolClasses()[0].PageSize)
}

// NewSegment makes one plain allocation for the segment: none ->
// allocated. It counts one page created and one page mapped.
func (s *segments) NewSegment(seg *core.Seg, size uint64, st *core.Stats) error {
	n := segmentSize(s.cfg, seg.Pool, size)
	ptr, err := s.d.MemAlloc(s.dev, n)
	if err != nil {
		return fmt.Errorf("allocating a %d-byte segment: %w", n, err)
	}
	seg.Base, seg.Size, seg.PageSize, seg.StartsMapped = ptr, n, n, true
	st.PagesCreated++
	st.Maps++
	return nil
}

// Map would map pages into a segment whose memory was given back. The
// block core never asks for it: a fallback segment is unmapped only when
// wholly free and is then dropped at once, and the release threshold is
// handled by the Allocator, not by the core. It fails with vmm.ErrInvalid.
func (s *segments) Map(seg *core.Seg, ptr vmm.DevicePtr, size, _ uint64, _ *core.Stats) error {
	return fmt.Errorf("mapping %d bytes at %v: the plain allocation of segment %v was freed and cannot come back at its address: %w",
		size, ptr, seg.Base, vmm.ErrInvalid)
}

// Unmap frees the segment's allocation: allocated -> none. The core asks
// only for the whole segment (its single page); on error nothing changed.
func (s *segments) Unmap(seg *core.Seg, ptr vmm.DevicePtr, size uint64, st *core.Stats) (uint64, error) {
	if ptr != seg.Base || size != seg.Size {
		return 0, fmt.Errorf("unmapping %d bytes at %v: only the whole segment %v+%d can be freed: %w",
			size, ptr, seg.Base, seg.Size, vmm.ErrInvalid)
	}
	if err := s.d.MemFree(seg.Base); err != nil {
		return 0, fmt.Errorf("freeing the %d-byte segment at %v: %w", seg.Size, seg.Base, err)
	}
	st.Unmaps++
	return size, nil
}

// DropSegment forgets a segment whose allocation Unmap has freed; there is
// nothing left to give back.
func (s *segments) DropSegment(*core.Seg, *core.Stats) error { return nil }

// CachedBytes is 0: freed segments are not kept.
func (s *segments) CachedBytes(core.Pool) uint64 { return 0 }

// ReleaseCache has nothing to release.
func (s *segments) ReleaseCache(*core.Stats) error { return nil }

func roundUp(n, unit uint64) uint64 { return (n + unit - 1) / unit * unit }
