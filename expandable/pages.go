package expandable

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/internal/pagerun"
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
	total uint64           // the device's memory
	types vmm.HandleType   // what new pages can be exported as
	rw    []vmm.AccessDesc // the owner's access: read-write for dev

	cache      [core.NumPools][]vmm.Handle // unmapped pages kept for reuse, by pool
	cacheBytes [core.NumPools]uint64
	// cacheFrom lists, by pool, the caches a run of the pool takes pages
	// from: its own, then its page mates' (Config.PageMates).
	cacheFrom  [core.NumPools][]core.Pool
	stuckBytes [core.NumPools]uint64 // the pages of every segment's stuck runs, by pool
	// hold is the bytes the cache may keep beyond its bound while a
	// growth recycles pages (core.PageHolder).
	hold uint64
	// loose are unmapped chunks (Config.ChunkBytes) the driver failed to
	// release, by pool: ReleaseCache tries again; they count as cached.
	loose      [core.NumPools][]looseChunk
	looseBytes [core.NumPools]uint64
	// exports are the kept exports of shared allocations (exports.go).
	exports exports
	// ghosts counts, by handle, the retired places a page is still
	// mapped at (retire.go); held are the pages the cache gave up while
	// so mapped, released once their last ghost is unmapped. They count
	// as cached.
	ghosts    map[vmm.Handle]int
	held      [core.NumPools][]vmm.Handle
	heldBytes [core.NumPools]uint64

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
// by page index (0 where none is mapped), and under Config.ChunkBytes the
// chunk each page belongs to.
type segPages struct {
	handles []vmm.Handle
	// spans: by page index, the chunk (a physical allocation of several
	// pages, mapped and unmapped whole) the page is part of; n == 0 for a
	// page of its own. Every page of a chunk has the chunk's handle in
	// handles. Nil while Config.ChunkBytes is 0.
	spans []chunkSpan
	stuck []stuckRun // pages a failed Map left mapped in a hole
	// ghosts: by page index, the page retired from there and still
	// mapped there (retire.go); 0 where none.
	ghosts []vmm.Handle
}

// chunkSpan is a chunk: its first page and how many pages it has.
type chunkSpan struct{ first, n int32 }

// chunkAt returns the chunk page i belongs to, if any.
func (sp *segPages) chunkAt(i int) (chunkSpan, bool) {
	if i < len(sp.spans) && sp.spans[i].n > 0 {
		return sp.spans[i], true
	}
	return chunkSpan{}, false
}

var _ core.AllocBounder = (*pages)(nil)

// AllocBounds returns the pages of the physical allocation that page of
// seg belongs to: its chunk, or the page alone.
func (p *pages) AllocBounds(seg *core.Seg, page int) (first, n int) {
	if c, ok := seg.Data.(*segPages).chunkAt(page); ok {
		return int(c.first), int(c.n)
	}
	return page, 1
}

// chunkPages is how many pages of pool a new chunk has at most; 0 or 1:
// chunks are off for it.
func (p *pages) chunkPages(pool core.Pool) int {
	return int(p.cfg.ChunkBytes / p.pageSize(pool))
}

var _ core.Backing = (*pages)(nil)

func (p *pages) pageSize(pool core.Pool) uint64 {
	return p.cfg.PageSize(pool)
}

// NewSegment reserves size bytes, the address space the core sizes for
// the segment, rounded up to the pool's page size. none -> reserved.
func (p *pages) NewSegment(seg *core.Seg, size uint64, _ *core.Stats) error {
	ps := p.pageSize(seg.Pool)
	n := roundUp(size, ps)
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

// DropSegment unmaps the segment's stuck pages into the cache and gives
// the reservation back. reserved -> none. On error the segment is kept,
// and a later DropSegment tries again.
func (p *pages) DropSegment(seg *core.Seg, _ *core.Stats) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := seg.Data.(*segPages).ghostIn(0, math.MaxInt); i >= 0 {
		return fmt.Errorf("dropping segment %v: page %d is retired and still mapped: %w", seg.Base, i, vmm.ErrInUse)
	}
	if err := p.unstickLocked(seg, 0, math.MaxInt); err != nil {
		return err
	}
	if err := p.d.Unreserve(seg.Base, seg.Size); err != nil {
		return err
	}
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

// growHandles returns hs with at least n entries, the new ones zero.
func growHandles(hs []vmm.Handle, n int) []vmm.Handle {
	if n > len(hs) {
		hs = append(hs, make([]vmm.Handle, n-len(hs))...)
	}
	return hs
}

// Map maps a run of pages, each from the cache or new, with one Map a
// page and one SetAccess for the run, which grants the owner and every
// enabled peer read-write access: reserved -> mapped -> accessible. It
// takes (creates) every page of the run before it maps the first, as
// PyTorch's expandable segments do: the driver is quicker with a run of
// like calls than with creates and maps taking turns. On error it unmaps
// what it mapped and keeps or releases the pages it took; pages whose
// unmap failed too stay in the segment's books as stuck (see stuckRun).
// Stuck pages in the run are unmapped first: mapping over them would fail.
func (p *pages) Map(seg *core.Seg, ptr vmm.DevicePtr, size, whole uint64, st *core.Stats) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := seg.Data.(*segPages)
	ps := seg.PageSize
	first, n := pageRange(seg, ptr, size)
	sp.handles = growHandles(sp.handles, first+n)
	if err := p.unstickLocked(seg, first, first+n); err != nil {
		return fmt.Errorf("mapping %d pages at %v: %w", n, ptr, err)
	}
	if i := sp.ghostIn(first, first+n); i >= 0 {
		return fmt.Errorf("mapping %d pages at %v: page %d is retired and still mapped: %w", n, ptr, i, vmm.ErrInvalid)
	}
	if whole = min(whole, size) / ps * ps; p.chunkPages(seg.Pool) > 1 && whole > 0 && whole >= p.cfg.ChunkMinBytes {
		return p.mapChunkedLocked(seg, first, n, int(whole/ps), st)
	}
	left, err := pagerun.MapFrom(p.d, ptr, ps, sp.handles[first:first+n], p.accessLocked(), pagerun.Source{
		Take: func(int) (vmm.Handle, error) { return p.takePage(seg.Pool, st) },
		Give: func(hs []vmm.Handle) error { return p.putPages(seg.Pool, hs) },
	})
	if err != nil {
		p.stick(seg, first, left)
		return err
	}
	st.Maps += int64(n)
	st.SetAccessCalls++
	return nil
}

// stuckRun is a run of pages that a failed Map could not unmap: the driver
// has them mapped (their handles stay in segPages.handles) while the core
// counts their addresses as a hole. Forgetting them made every later
// growth into the hole fail on the overlap; kept, they are unmapped by the
// next Map over them, by ReleaseCache (EmptyCache, Close) and by
// DropSegment, and count as cached bytes (reserved) until then.
type stuckRun struct{ first, n int }

// stick records n pages from page first of seg as stuck. p.mu is held.
func (p *pages) stick(seg *core.Seg, first, n int) {
	if n == 0 {
		return
	}
	sp := seg.Data.(*segPages)
	sp.stuck = append(sp.stuck, stuckRun{first, n})
	p.stuckBytes[seg.Pool] += uint64(n) * seg.PageSize
}

// unstickLocked unmaps the stuck runs of seg that overlap pages [lo, hi)
// and puts their pages in the cache (or releases them). A run whose unmap
// fails again stays stuck, and the error says so. p.mu is held.
func (p *pages) unstickLocked(seg *core.Seg, lo, hi int) error {
	sp := seg.Data.(*segPages)
	var errs []error
	keep := sp.stuck[:0]
	for _, r := range sp.stuck {
		if r.first >= hi || r.first+r.n <= lo {
			keep = append(keep, r)
			continue
		}
		at := seg.Base.Add(uint64(r.first) * seg.PageSize)
		if err := pagerun.Unmap(p.d, at, seg.PageSize, r.n); err != nil {
			errs = append(errs, fmt.Errorf("pages left mapped by a failed undo: %w", err))
			keep = append(keep, r)
			continue
		}
		p.stuckBytes[seg.Pool] -= uint64(r.n) * seg.PageSize
		errs = append(errs, p.giveLocked(seg, r.first, r.first+r.n, p.putPage))
	}
	clear(sp.stuck[len(keep):])
	sp.stuck = keep
	return errors.Join(errs...)
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

// Unmap unmaps pages one by one (mapped/accessible -> reserved) and keeps
// each in the cache while it has room, else releases it. It returns the
// bytes unmapped, a prefix of the run on error.
func (p *pages) Unmap(seg *core.Seg, ptr vmm.DevicePtr, size uint64, st *core.Stats) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unmapLocked(seg, ptr, size, st, p.putPage)
}

// unmapLocked unmaps the pages of [ptr, ptr+size) one by one and hands
// each to put (putPage: the cache; releasePage: the driver; a page put
// fails to release it keeps in the cache, and the unmapping goes on). It
// stops at the first page the driver fails to unmap and returns the bytes
// unmapped before it: all of them unless the driver failed. p.mu is held.
func (p *pages) unmapLocked(seg *core.Seg, ptr vmm.DevicePtr, size uint64, st *core.Stats, put func(core.Pool, vmm.Handle) error) (uint64, error) {
	sp := seg.Data.(*segPages)
	ps := seg.PageSize
	first, n := pageRange(seg, ptr, size)
	end := first + n
	var done uint64
	var errs []error
	for done < size {
		at := ptr.Add(done)
		i := first + int(done/ps)
		m := 1
		if c, ok := sp.chunkAt(i); ok {
			if int(c.first) != i || int(c.first+c.n) > end {
				return done, errors.Join(append(errs, fmt.Errorf("unmapping page %d at %v: part of chunk %d+%d, which is unmapped only whole: %w", i, at, c.first, c.n, vmm.ErrInvalid))...)
			}
			m = int(c.n)
		}
		if err := p.d.Unmap(at, uint64(m)*ps); err != nil {
			return done, errors.Join(append(errs, fmt.Errorf("unmapping page at %v: %w", at, err))...)
		}
		st.Unmaps++
		done += uint64(m) * ps
		errs = append(errs, p.giveLocked(seg, i, i+m, put))
	}
	return done, errors.Join(errs...)
}

// takePage returns a cached page of the pool, or a new one.
func (p *pages) takePage(pool core.Pool, st *core.Stats) (vmm.Handle, error) {
	if h, ok := p.takeCached(pool, st); ok {
		return h, nil
	}
	ps := p.pageSize(pool)
	h, err := p.d.Create(p.dev, ps, p.types)
	if err != nil {
		return 0, fmt.Errorf("no cached page to reuse: %w", err)
	}
	st.PagesCreated++
	return h, nil
}

// takeCached returns a cached page of the pool or a page mate's, if any.
func (p *pages) takeCached(pool core.Pool, st *core.Stats) (vmm.Handle, bool) {
	ps := p.pageSize(pool)
	for _, q := range p.cacheFrom[pool] {
		if c := p.cache[q]; len(c) > 0 {
			h := c[len(c)-1]
			p.cache[q] = c[:len(c)-1]
			p.cacheBytes[q] -= ps
			st.PagesReused++
			return h, true
		}
	}
	return 0, false
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
	if p.hold >= ps {
		p.hold -= ps
		p.cache[pool] = append(p.cache[pool], h)
		p.cacheBytes[pool] += ps
		return nil
	}
	return p.releasePage(pool, h)
}

var _ core.PageHolder = (*pages)(nil)

// HoldPages lets the cache keep n more bytes beyond its bound until
// SettlePages: the pages a growth unmaps to map them again at once.
func (p *pages) HoldPages(n uint64) { p.hold += n }

// SettlePages ends the hold and releases every pool's cached pages over
// the bound, the ones cached last first.
func (p *pages) SettlePages(_ *core.Stats) error {
	p.hold = 0
	var errs []error
	for pool := range p.cache {
		ps := p.pageSize(core.Pool(pool))
		for p.cacheBytes[pool] > p.cfg.PageCacheBytes {
			c := p.cache[pool]
			h := c[len(c)-1]
			c[len(c)-1] = 0
			p.cache[pool] = c[:len(c)-1]
			p.cacheBytes[pool] -= ps
			if err := p.releasePage(core.Pool(pool), h); err != nil {
				errs = append(errs, err)
				break // releasePage kept it cached
			}
		}
	}
	return errors.Join(errs...)
}

// CachedBytes is the size of the cached pages of pool and of its stuck
// pages: physical memory held outside the mapped blocks.
func (p *pages) CachedBytes(pool core.Pool) uint64 {
	return p.cacheBytes[pool] + p.stuckBytes[pool] + p.looseBytes[pool] + p.heldBytes[pool]
}

// ReleaseCache unmaps every stuck page into the cache, then releases every
// cached page; those that fail stay stuck or cached, for the next call.
func (p *pages) ReleaseCache(_ *core.Stats) error {
	var errs []error
	p.mu.Lock()
	for seg := range p.mu.segs {
		errs = append(errs, p.unstickLocked(seg, 0, math.MaxInt))
	}
	p.mu.Unlock()
	errs = append(errs, p.releaseLoose())
	for pool := range p.cache {
		var err error
		p.cache[pool], err = releaseEach(p.cache[pool], func(h vmm.Handle) error {
			if p.ghosts[h] > 0 {
				p.hold1(core.Pool(pool), h)
				return nil
			}
			if err := p.release(h); err != nil {
				return fmt.Errorf("releasing page %#x: %w", uint64(h), err)
			}
			return nil
		})
		errs = append(errs, err)
		p.cacheBytes[pool] = uint64(len(p.cache[pool])) * p.pageSize(core.Pool(pool))
	}
	return errors.Join(errs...)
}

// releaseEach calls release on each of xs and returns, in place, those it
// failed for (kept for a later try), with their errors joined.
func releaseEach[T any](xs []T, release func(T) error) ([]T, error) {
	var errs []error
	keep := xs[:0]
	for _, x := range xs {
		if err := release(x); err != nil {
			errs = append(errs, err)
			keep = append(keep, x)
		}
	}
	clear(xs[len(keep):])
	return keep, errors.Join(errs...)
}

func roundUp(n, unit uint64) uint64 { return (n + unit - 1) / unit * unit }

// pageRange returns the index of the page of seg at ptr and how many
// pages [ptr, ptr+size) holds.
func pageRange(seg *core.Seg, ptr vmm.DevicePtr, size uint64) (first, n int) {
	ps := seg.PageSize
	return int(uint64(ptr-seg.Base) / ps), int(size / ps)
}
