package expandable

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/internal/pagerun"
	"github.com/xseg-dev/xseg/vmm"
)

// Chunks (Config.ChunkBytes): a growth backs the pages that lie wholly
// inside the block it grows for with physical allocations of up to
// ChunkBytes each (one, for any block up to that size), and the page the
// block ends in, which a later block may share, with a page of its own;
// each is mapped with one Map and the run gets one SetAccess. The page
// cache gives its pages first, to the edge, then to the inside from its
// low end. The driver unmaps a mapping only whole, so a chunk is unmapped
// only whole (the core rounds free ranges in to whole chunks through
// AllocBounds) and released when unmapped: chunks never go into the page
// cache, which keeps pages of one size. Sharing exports a chunk once
// (share.go).

// mapChunkedLocked maps the n pages from page first of seg as Map does,
// the first whole of them the inside of one block: chunks for the inside
// pages the cache does not give, pages of their own for the rest. On
// error nothing is mapped but pages whose undo failed, which stay stuck
// (see stuckRun); cached pages go back to the cache and new chunks are
// released. p.mu is held and the run's stuck pages are unmapped already.
func (p *pages) mapChunkedLocked(seg *core.Seg, first, n, whole int, st *core.Stats) error {
	sp := seg.Data.(*segPages)
	ps := seg.PageSize
	end := first + n
	inner := first + whole // [first, inner): the block's alone
	if end > len(sp.spans) {
		sp.spans = append(sp.spans, make([]chunkSpan, end-len(sp.spans))...)
	}
	// Cached pages: the edge first, then the inside from its low end.
	for i := end - 1; i >= inner; i-- {
		h, ok := p.takeCached(seg.Pool, st)
		if !ok {
			break
		}
		sp.handles[i] = h
	}
	for i := first; i < inner; i++ {
		h, ok := p.takeCached(seg.Pool, st)
		if !ok {
			break
		}
		sp.handles[i] = h
	}
	per := p.chunkPages(seg.Pool)
	for i := first; i < end; {
		if sp.handles[i] != 0 {
			i++
			continue
		}
		m := 1
		if i < inner {
			m = min(per, inner-i)
		}
		h, err := p.d.Create(p.dev, uint64(m)*ps, p.types)
		if err != nil {
			return errors.Join(fmt.Errorf("creating a physical allocation of %d pages: %w", m, err), p.giveLocked(seg, first, end, p.putPage))
		}
		st.PagesCreated++
		for j := i; j < i+m; j++ {
			sp.handles[j] = h
			if m > 1 { // a chunk of one page is a page of its own
				sp.spans[j] = chunkSpan{int32(i), int32(m)}
			}
		}
		i += m
	}
	// One Map an allocation and one SetAccess for the run, as every run
	// is mapped (pagerun); the allocations are all taken already.
	var run []vmm.Handle
	var spans []int
	for i := first; i < end; {
		m := 1
		if c, ok := sp.chunkAt(i); ok {
			m = int(c.n)
		}
		run, spans = append(run, sp.handles[i]), append(spans, m)
		i += m
	}
	left, err := pagerun.MapSpans(p.d, seg.Base.Add(uint64(first)*ps), ps, spans, run, p.accessLocked(), pagerun.Source{
		Take: func(i int) (vmm.Handle, error) { return run[i], nil },
		Give: func([]vmm.Handle) error { return nil }, // giveLocked below
	})
	if err != nil {
		// What a failed undo left mapped stays stuck; the rest goes back.
		stuck := 0
		for _, m := range spans[:left] {
			stuck += m
		}
		p.stick(seg, first, stuck)
		return errors.Join(err, p.giveLocked(seg, first+stuck, end, p.putPage))
	}
	st.Maps += int64(len(run))
	st.SetAccessCalls++
	return nil
}

// giveLocked hands back the unmapped pages [lo, hi) of seg and clears
// their places: a page of its own to put, a chunk (which starts in the
// range) to the driver. p.mu is held.
func (p *pages) giveLocked(seg *core.Seg, lo, hi int, put func(core.Pool, vmm.Handle) error) error {
	sp := seg.Data.(*segPages)
	var errs []error
	for i := lo; i < hi; {
		h, m := sp.handles[i], 1
		if c, ok := sp.chunkAt(i); ok {
			m = int(c.first+c.n) - i
			clear(sp.spans[i : i+m])
			if h != 0 {
				errs = append(errs, p.releaseChunk(seg.Pool, h, uint64(c.n)*seg.PageSize))
			}
		} else if h != 0 {
			errs = append(errs, put(seg.Pool, h))
		}
		clear(sp.handles[i : i+m])
		i += m
	}
	return errors.Join(errs...)
}

// looseChunk is an unmapped chunk the driver failed to release, and its
// size.
type looseChunk struct {
	h    vmm.Handle
	size uint64
}

// releaseChunk releases an unmapped chunk of size bytes, or keeps it
// loose (counted as cached) for ReleaseCache if the driver fails to.
func (p *pages) releaseChunk(pool core.Pool, h vmm.Handle, size uint64) error {
	if err := p.release(h); err != nil {
		p.loose[pool] = append(p.loose[pool], looseChunk{h, size})
		p.looseBytes[pool] += size
		return fmt.Errorf("releasing chunk %#x (kept for the next EmptyCache): %w", uint64(h), err)
	}
	return nil
}

// releaseLoose releases the chunks a release failed for; those that fail
// again stay.
func (p *pages) releaseLoose() error {
	var errs []error
	for pool := range p.loose {
		var err error
		p.loose[pool], err = releaseEach(p.loose[pool], func(c looseChunk) error {
			if err := p.release(c.h); err != nil {
				return fmt.Errorf("releasing chunk %#x: %w", uint64(c.h), err)
			}
			p.looseBytes[pool] -= c.size
			return nil
		})
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
