package expandable

import (
	"errors"
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
)

// Retired pages (core.PageRetirer): under Config.RecyclePages a growth
// takes free pages of its own stream without waiting for the stream. The
// pages go to the cache, from which the growth maps them at once, while
// they stay mapped where they were (CUDA maps one physical allocation at
// as many addresses as asked) until the Heap, once the work queued before
// their free is done, unmaps the old addresses with UnmapRetired. Until
// then the old place is a ghost: segPages.ghosts has the page's handle
// there, and pages.ghosts counts its ghosts. A page the cache would
// release while it has a ghost is held (not released: the physical
// memory is still in use, and so counted as cached) until its last ghost
// is unmapped.

var _ core.PageRetirer = (*pages)(nil)

// RetirePages moves the pages of [ptr, ptr+size) of seg, each an
// allocation of its own, into the cache and leaves them mapped at ptr.
func (p *pages) RetirePages(seg *core.Seg, ptr vmm.DevicePtr, size uint64, _ *core.Stats) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := seg.Data.(*segPages)
	ps := seg.PageSize
	first, n := pageRange(seg, ptr, size)
	sp.ghosts = growHandles(sp.ghosts, first+n)
	var errs []error
	for i := first; i < first+n; i++ {
		if _, ok := sp.chunkAt(i); ok || i >= len(sp.handles) || sp.handles[i] == 0 || sp.ghosts[i] != 0 {
			return uint64(i-first) * ps, errors.Join(append(errs, fmt.Errorf("retiring page %d of segment %v: not a mapped page of its own: %w", i, seg.Base, vmm.ErrInvalid))...)
		}
		h := sp.handles[i]
		sp.handles[i], sp.ghosts[i] = 0, h
		if p.ghosts == nil {
			p.ghosts = make(map[vmm.Handle]int)
		}
		p.ghosts[h]++
		errs = append(errs, p.putPage(seg.Pool, h))
	}
	return size, errors.Join(errs...)
}

// UnmapRetired unmaps the retired pages [ptr, ptr+size) of seg one by one
// and releases those the cache gave up meanwhile. It stops at the first
// page the driver fails to unmap.
func (p *pages) UnmapRetired(seg *core.Seg, ptr vmm.DevicePtr, size uint64, st *core.Stats) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := seg.Data.(*segPages)
	ps := seg.PageSize
	first, n := pageRange(seg, ptr, size)
	var errs []error
	for i := first; i < first+n; i++ {
		done := uint64(i-first) * ps
		if i >= len(sp.ghosts) || sp.ghosts[i] == 0 {
			return done, errors.Join(append(errs, fmt.Errorf("unmapping retired page %d of segment %v: none is retired there: %w", i, seg.Base, vmm.ErrInvalid))...)
		}
		if err := p.d.Unmap(ptr.Add(done), ps); err != nil {
			return done, errors.Join(append(errs, fmt.Errorf("unmapping retired page at %v: %w", ptr.Add(done), err))...)
		}
		st.Unmaps++
		h := sp.ghosts[i]
		sp.ghosts[i] = 0
		if p.ghosts[h]--; p.ghosts[h] > 0 {
			continue
		}
		delete(p.ghosts, h)
		// Held under the pool that gave it up last (a page mate's, maybe).
		for pool := range p.held {
			if j := slices.Index(p.held[pool], h); j >= 0 {
				p.held[pool] = slices.Delete(p.held[pool], j, j+1)
				p.heldBytes[pool] -= p.pageSize(core.Pool(pool))
				errs = append(errs, p.releasePage(core.Pool(pool), h))
				break
			}
		}
	}
	return size, errors.Join(errs...)
}

// hold1 keeps page h of pool, which has a ghost, instead of releasing it.
func (p *pages) hold1(pool core.Pool, h vmm.Handle) {
	p.held[pool] = append(p.held[pool], h)
	p.heldBytes[pool] += p.pageSize(pool)
}

// ghostIn returns the first page in [lo, hi) with a ghost, or -1.
func (sp *segPages) ghostIn(lo, hi int) int {
	for i := lo; i < min(hi, len(sp.ghosts)); i++ {
		if sp.ghosts[i] != 0 {
			return i
		}
	}
	return -1
}
