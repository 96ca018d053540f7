package expandable

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
)

// Pause and resume (the Allocator's core.TagSet; internal/core/pause.go
// has the rules). Here is what they do to pages: Pause unmaps each mapped
// page left of a tag once the core has given back its whole free pages,
// one Unmap a page, and releases it at once (not into the page cache: the
// point is to give the memory back); Resume maps a run of pages at each
// run the pause unmapped, with Map (cached pages first, one SetAccess a
// run, naming the owner and every enabled peer).

var _ core.Pauser = (*pages)(nil)

// PauseRuns unmaps and releases the pages of runs: mapped/accessible ->
// reserved. The first page of a run that fails to unmap and the rest of
// that run stay mapped as a stuck run (stuck pages count as cached and are
// unmapped by the next Map over them, ReleaseCache or DropSegment); the
// other runs go on. A page that fails to release stays in the cache.
func (p *pages) PauseRuns(runs []core.Run, st *core.Stats) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, r := range runs {
		done, err := p.unmapLocked(r.Seg, r.Ptr, r.Size, st, p.releasePage)
		if done < r.Size { // the driver kept this page mapped: it and the rest of the run stay, stuck
			ps, left := r.Seg.PageSize, r.Ptr.Add(done)
			p.stick(r.Seg, int(uint64(left-r.Seg.Base)/ps), int((r.Size-done)/ps))
			err = fmt.Errorf("%w (it and the %d pages after it stay mapped)", err, (r.Size-done)/ps-1)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// releasePage releases page h, or keeps it in the cache if the driver
// fails to: ReleaseCache tries again.
func (p *pages) releasePage(pool core.Pool, h vmm.Handle) error {
	if p.ghosts[h] > 0 {
		p.hold1(pool, h)
		return nil
	}
	if err := p.release(h); err != nil {
		p.cache[pool] = append(p.cache[pool], h)
		p.cacheBytes[pool] += p.pageSize(pool)
		return fmt.Errorf("releasing page %#x (kept in the cache): %w", uint64(h), err)
	}
	return nil
}

// ResumeRuns maps pages at runs, one Map (a run of pages) at a time. If
// one fails (Map undoes its own run), the runs mapped before it are
// given back with PauseRuns.
func (p *pages) ResumeRuns(runs []core.Run, st *core.Stats) error {
	for i, r := range runs {
		if err := p.Map(r.Seg, r.Ptr, r.Size, r.Size, st); err != nil {
			return errors.Join(err, p.PauseRuns(runs[:i], st))
		}
	}
	return nil
}
