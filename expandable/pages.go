package expandable

import (
	"errors"
	"fmt"
	"sync"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
)

// pages is the core.Backing of the expandable allocator: one reserved range
// per segment, physical pages mapped into it one handle per page, and a
// bounded cache of unmapped pages per pool. The Heap calls it with its lock
// held, which guards the cache. What peer access needs (the mapped pages
// of every segment and the access list) is guarded by mu as well, because
// EnablePeerAccess walks it without the Heap's lock; the lock order is the
// Heap's lock, then mu.
type pages struct {
	d     vmm.Driver
	dev   vmm.Device
	cfg   core.Config
	total uint64           // the device's memory: the size of a reservation
	types vmm.HandleType   // what new pages can be exported as
	rw    []vmm.AccessDesc // the owner's access: read-write for dev

	cache      [2][]vmm.Handle // unmapped pages kept for reuse, by pool
	cacheBytes [2]uint64

	mu struct {
		sync.Mutex
		// peers are the devices granted read-write access to every
		// mapped page (EnablePeerAccess), in the order enabled.
		peers []vmm.Device
		// access is what Map grants a new run: rw and every peer's
		// read-write access; nil while there are no peers.
		access []vmm.AccessDesc
		segs   map[*core.Seg]struct{} // live segments
		// imported are mappings made by an importer (package ipc) that
		// peers must reach too: address -> size.
		imported map[vmm.DevicePtr]uint64
	}
}

// segPages is a segment's own state: the handle behind each mapped page,
// by page index (0 where none is mapped).
type segPages struct {
	handles []vmm.Handle
}

var _ core.Backing = (*pages)(nil)

func (p *pages) pageSize(pool core.Pool) uint64 {
	if pool == core.Small {
		return p.cfg.SmallPageSize
	}
	return p.cfg.LargePageSize
}

// NewSegment reserves a range of the device's whole memory (more if size
// asks for it), rounded up to the pool's page size. none -> reserved.
func (p *pages) NewSegment(seg *core.Seg, size uint64, _ *core.Stats) error {
	ps := p.pageSize(seg.Pool)
	n := roundUp(max(p.total, size), ps)
	ptr, err := p.d.Reserve(n, 0)
	if err != nil {
		return fmt.Errorf("reserving %d bytes: %w", n, err)
	}
	seg.Base, seg.Size, seg.PageSize = ptr, n, ps
	seg.Data = &segPages{}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.segs == nil {
		p.mu.segs = make(map[*core.Seg]struct{})
	}
	p.mu.segs[seg] = struct{}{}
	return nil
}

// DropSegment gives the reservation back. reserved -> none.
func (p *pages) DropSegment(seg *core.Seg, _ *core.Stats) error {
	if err := p.d.Unreserve(seg.Base, seg.Size); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.mu.segs, seg)
	return nil
}

// accessLocked is the access list of a new run: the owner's and every
// enabled peer's. p.mu is held.
func (p *pages) accessLocked() []vmm.AccessDesc {
	if p.mu.access != nil {
		return p.mu.access
	}
	return p.rw
}

// Map maps a run of pages, each from the cache or new, with one Map a
// page and one SetAccess for the run, which grants the owner and every
// enabled peer read-write access: reserved -> mapped -> accessible. It
// takes (creates) every page of the run before it maps the first, as
// PyTorch's expandable segments do: the driver is quicker with a run of
// like calls than with creates and maps taking turns. On error it unmaps
// what it mapped and keeps or releases the pages it took.
func (p *pages) Map(seg *core.Seg, ptr vmm.DevicePtr, size uint64, st *core.Stats) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := seg.Data.(*segPages)
	ps := seg.PageSize
	first := int(uint64(ptr-seg.Base) / ps)
	n := int(size / ps)
	if need := first + n; need > len(sp.handles) {
		sp.handles = append(sp.handles, make([]vmm.Handle, need-len(sp.handles))...)
	}
	run := sp.handles[first : first+n]
	for i := range run {
		h, err := p.takePage(seg.Pool, st)
		if err != nil {
			return errors.Join(err, p.putPages(seg.Pool, run[:i]))
		}
		run[i] = h
	}
	for i, h := range run {
		at := ptr.Add(uint64(i) * ps)
		if err := p.d.Map(at, ps, h, 0); err != nil {
			err = fmt.Errorf("mapping page %d of %d at %v: %w", i+1, n, at, err)
			return errors.Join(err, p.putPages(seg.Pool, run[i:]), p.unmapRun(seg, ptr, i, st))
		}
		st.Maps++
	}
	st.SetAccessCalls++
	if err := p.d.SetAccess(ptr, size, p.accessLocked()); err != nil {
		err = fmt.Errorf("setting access to %d pages at %v: %w", n, ptr, err)
		return errors.Join(err, p.unmapRun(seg, ptr, n, st))
	}
	return nil
}

// putPages gives back pages taken for a run that were not mapped, and
// clears their places in the run.
func (p *pages) putPages(pool core.Pool, hs []vmm.Handle) error {
	var errs []error
	for i, h := range hs {
		errs = append(errs, p.putPage(pool, h))
		hs[i] = 0
	}
	return errors.Join(errs...)
}

// unmapRun undoes a partial Map of n pages at ptr. p.mu is held.
func (p *pages) unmapRun(seg *core.Seg, ptr vmm.DevicePtr, n int, st *core.Stats) error {
	if n == 0 {
		return nil
	}
	done, err := p.unmapLocked(seg, ptr, uint64(n)*seg.PageSize, st)
	st.Unmaps -= int64(done / seg.PageSize) // an undo, not an unmap of the policy
	st.Maps -= int64(done / seg.PageSize)
	if err != nil {
		return fmt.Errorf("undoing the mapping (pages stay mapped): %w", err)
	}
	return nil
}

// Unmap unmaps pages one by one (mapped/accessible -> reserved) and keeps
// each in the cache while it has room, else releases it. It returns the
// bytes unmapped, a prefix of the run on error.
func (p *pages) Unmap(seg *core.Seg, ptr vmm.DevicePtr, size uint64, st *core.Stats) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unmapLocked(seg, ptr, size, st)
}

// unmapLocked is Unmap with p.mu held.
func (p *pages) unmapLocked(seg *core.Seg, ptr vmm.DevicePtr, size uint64, st *core.Stats) (uint64, error) {
	sp := seg.Data.(*segPages)
	ps := seg.PageSize
	first := int(uint64(ptr-seg.Base) / ps)
	var done uint64
	for done < size {
		at := ptr.Add(done)
		if err := p.d.Unmap(at, ps); err != nil {
			return done, fmt.Errorf("unmapping page at %v: %w", at, err)
		}
		st.Unmaps++
		i := first + int(done/ps)
		h := sp.handles[i]
		sp.handles[i] = 0
		done += ps
		if err := p.putPage(seg.Pool, h); err != nil {
			return done, err
		}
	}
	return done, nil
}

// takePage returns a cached page of the pool, or a new one.
func (p *pages) takePage(pool core.Pool, st *core.Stats) (vmm.Handle, error) {
	if c := p.cache[pool]; len(c) > 0 {
		h := c[len(c)-1]
		p.cache[pool] = c[:len(c)-1]
		p.cacheBytes[pool] -= p.pageSize(pool)
		st.PagesReused++
		return h, nil
	}
	ps := p.pageSize(pool)
	h, err := p.d.Create(p.dev, ps, p.types)
	if err != nil {
		return 0, fmt.Errorf("creating a %d-byte page: %w", ps, err)
	}
	st.PagesCreated++
	return h, nil
}

// putPage keeps an unmapped page in the cache if it has room and releases
// it otherwise. A page that fails to release stays in the cache.
func (p *pages) putPage(pool core.Pool, h vmm.Handle) error {
	ps := p.pageSize(pool)
	if p.cacheBytes[pool]+ps <= p.cfg.PageCacheBytes {
		p.cache[pool] = append(p.cache[pool], h)
		p.cacheBytes[pool] += ps
		return nil
	}
	if err := p.d.Release(h); err != nil {
		p.cache[pool] = append(p.cache[pool], h)
		p.cacheBytes[pool] += ps
		return fmt.Errorf("releasing page %#x (kept in the cache): %w", uint64(h), err)
	}
	return nil
}

// CachedBytes is the size of the cached pages of pool.
func (p *pages) CachedBytes(pool core.Pool) uint64 { return p.cacheBytes[pool] }

// ReleaseCache releases every cached page; those that fail stay cached.
func (p *pages) ReleaseCache(_ *core.Stats) error {
	var errs []error
	for pool := range p.cache {
		keep := p.cache[pool][:0]
		for _, h := range p.cache[pool] {
			if err := p.d.Release(h); err != nil {
				errs = append(errs, fmt.Errorf("releasing page %#x: %w", uint64(h), err))
				keep = append(keep, h)
			}
		}
		clear(p.cache[pool][len(keep):])
		p.cache[pool] = keep
		p.cacheBytes[pool] = uint64(len(keep)) * p.pageSize(core.Pool(pool))
	}
	return errors.Join(errs...)
}

func roundUp(n, unit uint64) uint64 { return (n + unit - 1) / unit * unit }
