package core

import (
	"fmt"
	"sync"

	"github.com/xseg-dev/xseg/vmm"
)

// Pinning keeps a block, and so every page it touches, out of reuse while
// another process maps it. A pinned block that its owner frees becomes
// pending (active, no longer allocated) instead of free: it stays out of
// the free structures, so no allocation reuses its bytes, no coalescing
// absorbs it, and the pages it touches are never whole free pages, so
// EmptyCache, the OOM policy and the release threshold never unmap them.
// The last unpin of a freed block makes it free. Close unmaps everything,
// pinned or not: the importers keep their own references to the pages.
//
// The pin counts live in Heap.mu.pins, which is nil until the first pin.

// PinnedFunc is called by Pin, with the Heap's lock held, for the block
// being pinned: its segment, its address and the size its caller asked
// for. It reads what it needs of the Backing's state (the pages behind
// the block) and must not call the Heap.
type PinnedFunc func(seg *Seg, ptr vmm.DevicePtr, size uint64) error

// Pin pins the allocated block at ptr and calls f for it. It returns the
// function that removes this pin: safe to call more than once (only the
// first call counts) and from any goroutine, also after Close. A block may
// be pinned several times; it is reusable once every pin is gone and its
// owner has freed it. If f fails, nothing is pinned.
func (h *Heap) Pin(ptr vmm.DevicePtr, f PinnedFunc) (unpin func() error, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return nil, fmt.Errorf("pinning %v: %w", ptr, vmm.ErrClosed)
	}
	b := h.mu.blocks[ptr]
	if b == nil || b.state != stAllocated {
		return nil, fmt.Errorf("pinning %v: not an allocated block of this allocator: %w", ptr, vmm.ErrInvalid)
	}
	if b.seg.paused {
		return nil, fmt.Errorf("pinning %v: %w", ptr, ErrPaused)
	}
	if err := f(b.seg, b.ptr, b.requested); err != nil {
		return nil, err
	}
	if h.mu.pins == nil {
		h.mu.pins = make(map[*block]int)
	}
	h.mu.pins[b]++
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() { err = h.unpin(b) })
		return err
	}, nil
}

// unpin removes one pin of b and frees b if it was the last one and b's
// owner has freed it.
func (h *Heap) unpin(b *block) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		delete(h.mu.pins, b)
		return nil
	}
	n := h.mu.pins[b]
	if n <= 0 {
		return fmt.Errorf("unpinning %v: not pinned: %w", b.ptr, vmm.ErrInvalid)
	}
	if n > 1 {
		h.mu.pins[b] = n - 1
		return nil
	}
	delete(h.mu.pins, b)
	if b.state == stPending && b.events == 0 && !b.deferred {
		h.deactivateLocked(b)
		if h.cfg.ReleaseThreshold > 0 {
			h.trimLocked()
		}
	}
	if invariantsOn {
		h.checkLocked()
	}
	return nil
}

// keepPinnedLocked is called where a freed block would become free (Free,
// and the last stream event of a pending block): if b is pinned it parks
// b as pending instead and reports true.
func (h *Heap) keepPinnedLocked(b *block) bool {
	if len(h.mu.pins) == 0 || h.mu.pins[b] == 0 {
		return false
	}
	b.state = stPending
	return true
}

// Pinned reports how many blocks are pinned now.
func (h *Heap) Pinned() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.mu.pins)
}
