package core

import (
	"errors"
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// CheckpointPool returns the allocated blocks of private pool id.
func (h *Heap) CheckpointPool(id PoolID) (PoolCheckpoint, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.poolCallLocked("checkpointing", id); err != nil {
		return PoolCheckpoint{}, err
	}
	pp := h.mu.pools[id]
	if pp == nil {
		return PoolCheckpoint{}, fmt.Errorf("checkpointing pool %v: no such pool: %w", id, vmm.ErrInvalid)
	}
	cp := PoolCheckpoint{ID: id}
	forPoolBlocks(pp, func(b *block) {
		if b.state == stAllocated {
			cp.Blocks = append(cp.Blocks, CheckpointBlock{Ptr: b.ptr, Size: b.size, Requested: b.requested})
		}
	})
	slices.SortFunc(cp.Blocks, func(a, b CheckpointBlock) int { return cmpDev(a.Ptr, b.Ptr) })
	return cp, nil
}

func cmpDev(a, b vmm.DevicePtr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func forPoolBlocks(pp *privatePool, f func(*block)) {
	for _, st := range pp.states {
		for _, seg := range st.segs {
			for b := seg.first; b != nil; b = b.next {
				f(b)
			}
		}
	}
}

// RestorePool puts the private pool of cp back to cp: blocks allocated now
// that cp does not list are freed, and blocks cp lists that are not
// allocated now are allocated again at their addresses. It returns both
// sets of addresses. It waits for the pool's pending frees first, and
// fails while a pool is active, for a pool that is not retained, for a
// block that is not whole 512-byte units or whose requested bytes are not
// 1 to its size (then nothing changes), and when a block cp lists lies on
// memory that is neither free nor mapped (then the frees are done and the
// allocations up to that block).
func (h *Heap) RestorePool(cp PoolCheckpoint) (freed, allocated []vmm.DevicePtr, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.poolCallLocked("restoring", cp.ID); err != nil {
		return nil, nil, err
	}
	if h.capturingLocked() {
		return nil, nil, fmt.Errorf("restoring pool %v while a pool is active: %w", cp.ID, vmm.ErrInUse)
	}
	pp := h.mu.pools[cp.ID]
	if pp == nil || pp.uses == 0 {
		return nil, nil, fmt.Errorf("restoring pool %v: the pool is not retained: %w", cp.ID, vmm.ErrInvalid)
	}
	if pp.paused() {
		return nil, nil, fmt.Errorf("restoring pool %v of tag %q: %w", cp.ID, pp.tag.name, ErrPaused)
	}
	for _, cb := range cp.Blocks {
		// A block of another size would break the books (blocks are
		// whole 512-byte units); refuse before changing anything.
		if cb.Size == 0 || cb.Size%MinBlock != 0 || cb.Ptr.Add(cb.Size) < cb.Ptr {
			return nil, nil, fmt.Errorf("restoring pool %v: block %v+%d of the checkpoint is not a positive multiple of %d bytes: %w", cp.ID, cb.Ptr, cb.Size, MinBlock, vmm.ErrInvalid)
		}
		// The requested bytes are what the statistics count and what a
		// tag's pause backs up and restores: past the block they would
		// reach its neighbours' memory.
		if cb.Requested == 0 || cb.Requested > cb.Size {
			return nil, nil, fmt.Errorf("restoring pool %v: block %v+%d of the checkpoint has %d requested bytes, want 1 to its size: %w", cp.ID, cb.Ptr, cb.Size, cb.Requested, vmm.ErrInvalid)
		}
	}
	h.settleLocked()
	in := func(b *block) bool { return b.seg.st.key.private == cp.ID }
	if err := h.waitPendingLocked(in); err != nil {
		return nil, nil, fmt.Errorf("restoring pool %v: %w", cp.ID, err)
	}
	want := make(map[vmm.DevicePtr]uint64, len(cp.Blocks))
	for _, cb := range cp.Blocks {
		want[cb.Ptr] = cb.Size
	}
	var stale []*block
	forPoolBlocks(pp, func(b *block) {
		if b.state == stAllocated && want[b.ptr] != b.size {
			stale = append(stale, b)
		}
	})
	for _, b := range stale {
		freed = append(freed, b.ptr)
		h.freeAllocatedLocked(b)
	}
	for _, st := range pp.states {
		h.flush(st)
	}
	for _, cb := range cp.Blocks {
		if b := h.mu.blocks[cb.Ptr]; b != nil && b.state == stAllocated && b.size == cb.Size && b.seg.st.key.private == cp.ID {
			continue
		}
		if err := h.carveLocked(pp, cb); err != nil {
			err = fmt.Errorf("restoring pool %v: %w", cp.ID, err)
			return freed, allocated, errors.Join(err, h.verifyIfOn())
		}
		allocated = append(allocated, cb.Ptr)
	}
	if invariantsOn {
		h.checkLocked()
	}
	return freed, allocated, nil
}

func (h *Heap) verifyIfOn() error {
	if invariantsOn {
		return h.verifyLocked()
	}
	return nil
}

// freeAllocatedLocked frees allocated block b without stream events: the
// caller has said the memory is dead.
func (h *Heap) freeAllocatedLocked(b *block) {
	if h.mu.hist != nil {
		h.noteLocked(ActionFreeRequested, b.ptr, b.size, b.seg)
	}
	h.unallocateLocked(b)
	b.uses = b.uses[:0]
	if !h.keepPinnedLocked(b) {
		h.deactivateLocked(b)
	}
}

// carveLocked allocates the block cb describes out of the free block of
// pool pp that holds it.
func (h *Heap) carveLocked(pp *privatePool, cb CheckpointBlock) error {
	end := cb.Ptr.Add(cb.Size)
	var hold *block
	for _, st := range pp.states {
		for _, seg := range st.segs {
			if cb.Ptr < seg.Base || end > seg.End() {
				continue
			}
			for b := seg.first; b != nil; b = b.next {
				if b.ptr <= cb.Ptr && end <= b.end() {
					hold = b
					break
				}
			}
		}
	}
	if hold == nil || hold.state != stFree || hold.inExact || uint64(cb.Ptr-hold.seg.Base)%MinBlock != 0 {
		return fmt.Errorf("block %v+%d of the checkpoint is not on free mapped memory of the pool: %w", cb.Ptr, cb.Size, vmm.ErrInvalid)
	}
	st := hold.seg.st
	st.removeFree(hold)
	b := hold
	if b.ptr < cb.Ptr {
		b = h.splitAt(hold, uint64(cb.Ptr-hold.ptr))
		st.insertFree(hold)
	}
	h.handOutLocked(b, cb.Size, cb.Requested)
	return nil
}
