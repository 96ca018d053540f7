package core

import (
	"errors"
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// Private pools keep the memory of CUDA graph captures apart.
//
// A captured graph replays kernels at the addresses they were given during
// capture, including addresses of temporaries freed inside the capture.
// Those bytes belong to the graph for as long as it lives: handing them to
// anything outside the graph lets every replay overwrite it. PyTorch's own
// allocator therefore allocates a capture's memory from a private pool,
// keyed by a pool id, that nothing else draws from; blocks freed during or
// after the capture go back to that pool only, and the pool's memory goes
// back to the device only when the last graph (or other user) releases it.
// Two graphs captured with one pool id share the pool.
//
// Here a private pool is a set of (stream, size class) states of their own,
// with their own segments. While a pool is active (BeginAllocateToPool,
// until EndAllocateToPool), allocations that its route accepts come from
// the pool. While any pool is active the Heap makes no driver call that is
// illegal during stream capture: no event query or record, no stream or
// event synchronize, no unmap; the frees that would record events are
// deferred until no pool is active, as PyTorch defers them. Mapping new
// pages (growth) stays legal: package vmm/cuda runs the VMM calls in the
// relaxed capture mode.
//
// The pages of a pool that is in use are never unmapped (not by EmptyCache,
// the OOM policy, page stealing or the release threshold): a graph's
// freed temporaries are free to the allocator but not to the graph.

// privatePool is one private pool.
type privatePool struct {
	id PoolID
	// uses counts BeginAllocateToPool and RetainPool calls not yet
	// matched by ReleasePool. At zero the pool is released: its memory
	// goes back once nothing in it is allocated.
	uses   int
	states []*state
	// tag is set for the pool of a tag (tags.go), nil for the others.
	tag *tagState
}

// route sends the allocations that filter accepts to pool id while it is
// active. A nil filter accepts none: only AllocInPool reaches the pool (the
// caller routes, as libxseg does with PyTorch's filter).
type route struct {
	id     PoolID
	filter func(vmm.Stream) bool
}

// capturingLocked reports whether a pool is active: whether calls illegal
// during stream capture must be avoided.
func (h *Heap) capturingLocked() bool { return len(h.mu.routes) > 0 }

// RetainPool makes private pool id if it does not exist and counts one more
// use of it; ReleasePool undoes it.
func (h *Heap) RetainPool(id PoolID) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.poolCallLocked("retaining", id); err != nil {
		return err
	}
	h.retainLocked(id)
	return nil
}

func (h *Heap) poolCallLocked(what string, id PoolID) error {
	if h.mu.closed {
		return fmt.Errorf("%s pool %v: %w", what, id, vmm.ErrClosed)
	}
	if id.IsZero() {
		return fmt.Errorf("%s pool %v: the zero id names no private pool: %w", what, id, vmm.ErrInvalid)
	}
	if id.IsTag() && h.mu.pools[id] == nil {
		return fmt.Errorf("%s pool %v: the id is in the range of tags' pools and names no tag: %w", what, id, vmm.ErrInvalid)
	}
	return nil
}

func (h *Heap) retainLocked(id PoolID) *privatePool {
	pp := h.mu.pools[id]
	if pp == nil {
		if h.mu.pools == nil {
			h.mu.pools = make(map[PoolID]*privatePool)
		}
		pp = &privatePool{id: id}
		h.mu.pools[id] = pp
	}
	pp.uses++
	return pp
}

// BeginAllocateToPool retains pool id (making it if need be) and makes it
// active: until EndAllocateToPool, every allocation whose stream filter
// accepts comes from the pool. filter is called with the Heap's lock held
// and must not call the Heap; a nil filter routes nothing (AllocInPool
// still reaches the pool). Several pools may be active at once; the first
// begun whose filter accepts wins.
func (h *Heap) BeginAllocateToPool(id PoolID, filter func(vmm.Stream) bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.poolCallLocked("beginning to allocate to", id); err != nil {
		return err
	}
	if !h.capturingLocked() && len(h.mu.retiring) > 0 {
		// A capture may follow, during which nothing can be waited for:
		// unmap the retired pages now (retire.go).
		if err := h.settleAllRetiredLocked(false); err != nil {
			h.log.Warn("xseg: unmapping retired pages before a pool becomes active", "err", err)
		}
	}
	h.retainLocked(id)
	if pp := h.mu.pools[id]; pp != nil && pp.tag != nil {
		pp.tag.routed = true
	}
	h.mu.routes = append(h.mu.routes, route{id: id, filter: filter})
	return nil
}

// EndAllocateToPool stops routing allocations to pool id (the route its
// earliest BeginAllocateToPool made still active). The pool stays retained
// until ReleasePool. Once no pool is active, the frees deferred meanwhile
// record their events and released pools give their memory back.
func (h *Heap) EndAllocateToPool(id PoolID) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.poolCallLocked("ending allocation to", id); err != nil {
		return err
	}
	i := slices.IndexFunc(h.mu.routes, func(r route) bool { return r.id == id })
	if i < 0 {
		return fmt.Errorf("ending allocation to pool %v: the pool is not active: %w", id, vmm.ErrInvalid)
	}
	h.mu.routes = slices.Delete(h.mu.routes, i, i+1)
	if !h.capturingLocked() {
		h.settleLocked()
	}
	if invariantsOn {
		h.checkLocked()
	}
	return nil
}

// ReleasePool counts one use of pool id less. The last release gives back
// the pool's free pages at once (waiting for all work on the device first,
// since a graph may replay on any stream) and the rest as its blocks are
// freed; the pool is gone once nothing in it is allocated. Releasing while
// a pool is active defers the unmapping until none is.
func (h *Heap) ReleasePool(id PoolID) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.poolCallLocked("releasing", id); err != nil {
		return err
	}
	pp := h.mu.pools[id]
	if pp == nil || pp.uses == 0 {
		return fmt.Errorf("releasing pool %v: no use of it is held: %w", id, vmm.ErrInvalid)
	}
	if pp.tag != nil && pp.uses == 1 {
		return fmt.Errorf("releasing pool %v: the pool of tag %q holds its own use, never released: %w", id, pp.tag.name, vmm.ErrInvalid)
	}
	pp.uses--
	var err error
	if pp.uses == 0 && !h.capturingLocked() {
		err = h.givePoolBackLocked(pp)
	}
	if invariantsOn {
		h.checkLocked()
	}
	return err
}

// settleLocked does what waited for no pool to be active: record the
// events of deferred frees and give released pools back.
func (h *Heap) settleLocked() {
	h.flushDeferredLocked()
	for _, pp := range h.mu.pools {
		if pp.uses == 0 {
			if err := h.givePoolBackLocked(pp); err != nil {
				h.log.Warn("xseg: giving a released pool's memory back", "pool", pp.id, "err", err)
			}
		}
	}
}

// givePoolBackLocked unmaps the whole free pages of released pool pp,
// releases them to the driver (with the rest of the page cache) and gives
// back its empty segments; with no segment left, the pool is gone. The
// pool's freed blocks still waiting for stream events are waited for:
// after the device-wide sync their events have completed. While a pool is
// active it does nothing (no sync, no unmap during a capture):
// settleLocked gives the pool back once none is.
func (h *Heap) givePoolBackLocked(pp *privatePool) error {
	if h.capturingLocked() || pp.paused() {
		return nil
	}
	// Coalesce first: blocks parked in exact-size lists may make whole
	// free pages only together, and whether the device must be synced
	// depends on whether any page will be unmapped.
	for _, st := range pp.states {
		h.flush(st)
	}
	inPool := func(b *block) bool { return b.seg.st.key.private == pp.id }
	pending := slices.ContainsFunc(h.mu.pending, func(p pendingEvent) bool { return inPool(p.b) })
	if poolMapped(pp) > 0 && (pending || hasFreePage(pp)) {
		if err := h.waitTimedLocked(func() error { return h.drv.DeviceSynchronize(h.dev) }); err != nil {
			return fmt.Errorf("giving back pool %v: waiting for the device: %w", pp.id, err)
		}
	}
	var errs []error
	if pending {
		errs = append(errs, h.waitPendingLocked(inPool))
	}
	for _, st := range pp.states {
		errs = append(errs, h.releaseStateLocked(st, true))
	}
	// Unmapped pages went to the page cache; a destroyed graph's memory
	// goes back to the device, where another process may want it.
	errs = append(errs, h.releaseCacheLocked())
	for _, st := range pp.states {
		if len(st.segs) > 0 {
			return errors.Join(errs...)
		}
	}
	for _, st := range pp.states {
		delete(h.mu.states, st.key)
	}
	delete(h.mu.pools, pp.id)
	return errors.Join(errs...)
}

func poolMapped(pp *privatePool) uint64 {
	var n uint64
	for _, st := range pp.states {
		for _, seg := range st.segs {
			n += seg.mapped
		}
	}
	return n
}

// hasFreePage reports whether a segment of pp has a whole free page; the
// pool's exact-size lists must have been flushed.
func hasFreePage(pp *privatePool) bool {
	for _, st := range pp.states {
		for _, seg := range st.segs {
			if hasWholePage(seg, keepOut{}) {
				return true
			}
		}
	}
	return false
}

// poolStateLocked returns the state of (s, p) in private pool pp.
func (h *Heap) poolStateLocked(pp *privatePool, s vmm.Stream, p Pool) *state {
	k := stateKey{stream: s, pool: p, private: pp.id}
	st := h.mu.states[k]
	if st == nil {
		st = newState(k, h.mu.nodes)
		h.mu.states[k] = st
		pp.states = append(pp.states, st)
	}
	return st
}

// routeLocked returns the state of a private pool an allocation of pool p
// on stream s goes to, or nil for the shared pools.
func (h *Heap) routeLocked(s vmm.Stream, p Pool) *state {
	for _, r := range h.mu.routes {
		if r.filter != nil && r.filter(s) {
			return h.poolStateLocked(h.mu.pools[r.id], s, p)
		}
	}
	return nil
}

// AllocInPool returns a block of at least size bytes from private pool id
// (retained, active or not) for use on stream s.
func (h *Heap) AllocInPool(id PoolID, size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	if id.IsZero() {
		// allocTo would take the zero id for "no pool named" and
		// allocate from the shared pools.
		return 0, fmt.Errorf("allocating %d bytes in pool %v: the zero id names no private pool: %w", size, id, vmm.ErrInvalid)
	}
	return h.allocTo(size, s, true, id)
}

// deferLocked parks allocated block b, used on other streams, as pending
// without recording events: events are not recorded while a pool is
// active. settleLocked records them once none is.
func (h *Heap) deferLocked(b *block) {
	b.state = stPending
	b.deferred = true
	h.mu.deferred = append(h.mu.deferred, b)
}

// flushDeferredLocked records the events of the deferred frees; a block
// whose events cannot be recorded stays deferred.
func (h *Heap) flushDeferredLocked() {
	keep := h.mu.deferred[:0]
	for _, b := range h.mu.deferred {
		b.state = stAllocated // parkLocked's precondition
		if err := h.parkLocked(b); err != nil {
			b.state = stPending
			h.log.Warn("xseg: recording the events of a free deferred during a capture", "ptr", b.ptr, "err", err)
			keep = append(keep, b)
			continue
		}
		b.deferred = false
		if b.state == stAllocated && !h.keepPinnedLocked(b) {
			h.deactivateLocked(b) // every stream that used it is gone
		}
	}
	clear(h.mu.deferred[len(keep):])
	h.mu.deferred = keep
}

// PoolAllocations returns the addresses of the blocks allocated in private
// pool id, in address order.
func (h *Heap) PoolAllocations(id PoolID) ([]vmm.DevicePtr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.poolCallLocked("listing", id); err != nil {
		return nil, err
	}
	pp := h.mu.pools[id]
	if pp == nil {
		return nil, fmt.Errorf("listing pool %v: no such pool: %w", id, vmm.ErrInvalid)
	}
	var ptrs []vmm.DevicePtr
	for _, st := range pp.states {
		for _, seg := range st.segs {
			for b := seg.first; b != nil; b = b.next {
				if b.state == stAllocated {
					ptrs = append(ptrs, b.ptr)
				}
			}
		}
	}
	slices.Sort(ptrs)
	return ptrs, nil
}
