package core

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Taking blocks back without the Heap. libxseg's C API parks frees and
// lets a later allocation of exactly the same request on the same stream
// take a parked block back without calling Go at all (cmd/libxseg,
// freequeue.go). Such a block never leaves the Heap's books: it stays
// allocated, for the same request, on the stream it was made for, which
// is what freeing it and allocating it again on that stream would leave.
// Only the accumulated counts miss the pair; CountReused adds it.

// AllocReusable is Alloc that also reports whether the block may be taken
// back so: whether freeing it now would take Free's warm path (a block of
// a shared pool; no history, pins, route or release threshold) and the
// block is smaller than a page of its pool. A block of a page or more
// decides which whole pages can be unmapped or recycled: Free and the
// next Alloc let it merge with free neighbours and be placed anew, which
// taking it back would skip. A caller
// must stop taking blocks back as soon as anything else is done to the
// Heap or the block (libxseg: any other call into Go).
//
// It takes the Heap's lock once, as Alloc does: the answer is about the
// block as it was handed out.
func (h *Heap) AllocReusable(size uint64, s vmm.Stream) (vmm.DevicePtr, bool, error) {
	if size == 0 {
		return 0, false, errZeroSize()
	}
	rs, pool := h.sizeClass(size)
	h.mu.Lock()
	defer h.mu.Unlock()
	b, err := h.allocLocked(size, rs, pool, s, true, PoolID{}, nil)
	if err != nil {
		return 0, false, err
	}
	return b.ptr, h.plainFreeLocked(b) && b.size < b.seg.PageSize, nil
}

// CountReused counts an allocation and a free of the allocated block at
// ptr that were made without the Heap: the block was freed and taken back
// for the same request on the same stream. After Close it fails with
// vmm.ErrClosed.
func (h *Heap) CountReused(ptr vmm.DevicePtr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return fmt.Errorf("counting a block taken back at %v: %w", ptr, vmm.ErrClosed)
	}
	b := h.blockLocked(ptr)
	if b == nil || b.state != stAllocated {
		return fmt.Errorf("counting a block taken back at %v: not an allocated block: %w", ptr, vmm.ErrInvalid)
	}
	h.mu.bstats.countPair(b.seg.Pool, b.size, b.requested)
	if h.mu.hist != nil {
		h.noteLocked(ActionFreeRequested, b.ptr, b.size, b.seg)
		h.noteLocked(ActionFreeCompleted, b.ptr, b.size, b.seg)
		h.noteLocked(ActionAlloc, b.ptr, b.size, b.seg)
	}
	return nil
}
