package core

import (
	"errors"
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// Pause and resume of tags (tags.go).
//
// A tag is live or paused; nothing in between is ever visible. Pause takes
// a live tag to paused:
//
//  1. refuse if a block of the tag is pinned (shared with another process:
//     the importer maps the same physical pages, which pausing would
//     neither free nor keep coherent);
//  2. wait for all work on the device (a graph may replay on any stream);
//  3. with backup, copy the requested bytes of every allocated block to
//     host memory;
//  4. give back the whole free pages of the tag's segments, as EmptyCache
//     does a shared pool's (their addresses become holes; a segment left
//     empty goes, with its range), unless BeginAllocateToPool ever routed
//     to the tag (a CUDA graph captured into it addresses its free blocks
//     when it replays); then unmap every page still mapped and
//     release it (Pauser.PauseRuns). The blocks keep their books:
//     allocated blocks stay allocated at their addresses, free ones free;
//     the segments with blocks and their reserved ranges stay.
//
// A failure in 1 to 3 leaves the tag live, untouched. Step 4 always
// finishes: a page the driver fails to unmap is kept mapped by the Backing
// as a stuck page (reserved, not the tag's) until a later map over it,
// EmptyCache or Close unmaps it; the tag is paused and Pause reports the
// error. The copy, if asked, was complete before the first unmap.
//
// Resume takes a paused tag back to live: it maps new pages at the very
// runs that were mapped (the blocks' books did not change while paused):
// the pages allocated blocks were in, not the free pages step 4 gave back,
// granting the device and every enabled peer access, and copies the backup
// back. If mapping fails the Backing undoes it (Pauser.ResumeRuns); if a
// copy fails the pages are given back again (PauseRuns). Either way the
// tag stays paused, the backup kept, and a later Resume starts afresh.
// Without backup the bytes of a resumed tag are unspecified (zero on the
// host backend).
//
// While paused: allocations in the tag fail with ErrPaused; Free of a
// block of the tag works (books only: nothing is mapped to touch) and the
// block is not restored; Pin and RestorePool fail with ErrPaused;
// EmptyCache, the OOM policy, stealing and the release threshold never
// touch the tag (it is a private pool in use). Close gives everything
// back, paused or not.

// A Pauser is a Backing that can give back the pages behind blocks and map
// new ones at the same addresses later. The expandable allocator's pages
// are one; fallback's plain allocations cannot be mapped again at their
// addresses.
type Pauser interface {
	// PauseRuns unmaps the whole mapped pages of runs and releases them:
	// mapped/accessible -> reserved. It always finishes: a page it fails
	// to unmap it keeps mapped as a stuck page, counted in CachedBytes and
	// unmapped by the next Map over it, ReleaseCache or DropSegment; a page
	// it fails to release it keeps in its cache. It returns every error.
	PauseRuns(runs []Run, st *Stats) error
	// ResumeRuns maps new pages at runs, accessible to the device and
	// every peer: reserved -> accessible. On error nothing is mapped at
	// the runs but stuck pages, as PauseRuns keeps them.
	ResumeRuns(runs []Run, st *Stats) error
}

// Run is a run of whole pages of a segment.
type Run struct {
	Seg  *Seg
	Ptr  vmm.DevicePtr
	Size uint64
}

// pauseState is a paused tag's: the bytes given back and the backup.
type pauseState struct {
	bytes uint64
	// backup holds the requested bytes of the blocks allocated at pause
	// time, by address; nil for a pause without backup.
	backup map[vmm.DevicePtr][]byte
}

// Pause pauses the named tags (every tag when none is named), one after
// the other, each either fully or not at all (see above). A paused tag is
// left as it is, whatever backup says. It fails while a private pool is
// active (a stream capture forbids the device-wide wait). The first tag
// that fails stops it: the tags before it are paused, those after it are
// not tried, and the error names the tag.
func (h *Heap) Pause(backup bool, tags ...string) error {
	return h.forTags("pausing", tags, func(pp *privatePool, pr Pauser) error {
		if pp.paused() {
			return nil
		}
		if err := h.pauseLocked(pp, backup, pr); err != nil {
			return fmt.Errorf("pausing tag %q: %w", pp.tag.name, err)
		}
		return nil
	})
}

// forTags calls f, with the lock held, for the pools of the named tags
// (every tag when none is named) until it fails: what Pause and Resume
// share.
func (h *Heap) forTags(what string, tags []string, f func(*privatePool, Pauser) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	pools, err := h.tagPoolsLocked(what, tags) // after Close: vmm.ErrClosed, whatever the Backing
	if err != nil {
		return err
	}
	pr, ok := h.back.(Pauser)
	if !ok {
		return fmt.Errorf("%s tags: this allocator's memory cannot be mapped again at the same addresses (plain allocations): %w", what, vmm.ErrNotSupported)
	}
	if h.capturingLocked() {
		return fmt.Errorf("%s tags: %w", what, spec.ErrCapturing)
	}
	for _, pp := range pools {
		if err := f(pp, pr); err != nil {
			return err
		}
	}
	return nil
}

func (h *Heap) pauseLocked(pp *privatePool, backup bool, pr Pauser) error {
	for b := range h.mu.pins {
		if b.seg.st.key.private == pp.id {
			return fmt.Errorf("block %v+%d is shared with another process (pinned): %w", b.ptr, b.size, vmm.ErrInUse)
		}
	}
	runs := poolRuns(pp)
	if len(runs) > 0 {
		if err := h.waitTimedLocked(func() error { return h.drv.DeviceSynchronize(h.dev) }); err != nil {
			return fmt.Errorf("waiting for the device: %w", err)
		}
	}
	ps := &pauseState{}
	if backup {
		var err error
		if ps.backup, err = h.backupLocked(pp); err != nil {
			return err
		}
	}
	// The whole free pages go back to the driver for good, as EmptyCache
	// gives back a shared pool's (through the page cache, released with
	// them): Resume maps only what blocks were allocated in. The device
	// is idle (synced), so nothing waits. Not in a tag a route ever
	// reached: a graph captured there writes its free blocks.
	var rerr error
	if !pp.tag.routed {
		for _, st := range pp.states {
			rerr = errors.Join(rerr, h.releaseStateLocked(st, true))
		}
		rerr = errors.Join(rerr, h.releaseCacheLocked())
		runs = poolRuns(pp)
	}
	err := errors.Join(rerr, h.pageWorkLocked(func() error { return pr.PauseRuns(runs, &h.mu.stats) }))
	ps.bytes = h.markPausedLocked(pp, runs, true)
	pp.tag.pause = ps
	pp.tag.pauses++
	if invariantsOn {
		h.checkLocked()
	}
	if err != nil {
		return fmt.Errorf("the tag is paused, but pages the driver did not give back stay held until EmptyCache: %w", err)
	}
	return nil
}

// backupLocked copies the requested bytes of every allocated block of pp
// to host memory.
func (h *Heap) backupLocked(pp *privatePool) (map[vmm.DevicePtr][]byte, error) {
	backup := make(map[vmm.DevicePtr][]byte)
	var err error
	forPoolBlocks(pp, func(b *block) {
		if err != nil || b.state != stAllocated {
			return
		}
		data := make([]byte, b.requested)
		if cerr := h.drv.CopyDtoH(data, b.ptr); cerr != nil {
			err = fmt.Errorf("backing up block %v+%d: %w", b.ptr, b.requested, cerr)
			return
		}
		backup[b.ptr] = data
	})
	if err != nil {
		return nil, err
	}
	return backup, nil
}

// poolRuns returns the runs of mapped pages of pp's segments.
func poolRuns(pp *privatePool) []Run {
	var runs []Run
	for _, st := range pp.states {
		for _, seg := range st.segs {
			mappedRuns(seg, func(ptr vmm.DevicePtr, size uint64) {
				runs = append(runs, Run{Seg: seg, Ptr: ptr, Size: size})
			})
		}
	}
	return runs
}

// Resume resumes the named tags (every tag when none is named), one after
// the other, each either fully or not at all (see above). A live tag is
// left as it is. It fails while a private pool is active (the copies of
// the backup wait for the device). The first tag that fails stops it.
func (h *Heap) Resume(tags ...string) error {
	return h.forTags("resuming", tags, func(pp *privatePool, pr Pauser) error {
		if !pp.paused() {
			return nil
		}
		err := h.resumeLocked(pp, pr)
		if invariantsOn {
			h.checkLocked()
		}
		if err != nil {
			return fmt.Errorf("resuming tag %q (it stays paused): %w", pp.tag.name, err)
		}
		return nil
	})
}

func (h *Heap) resumeLocked(pp *privatePool, pr Pauser) error {
	runs := poolRuns(pp)
	if err := h.mapRunsLocked(pr, runs); err != nil {
		return err
	}
	if err := h.restoreLocked(pp); err != nil {
		err = errors.Join(err, h.pageWorkLocked(func() error { return pr.PauseRuns(runs, &h.mu.stats) }), h.releaseCacheLocked())
		return err
	}
	h.markPausedLocked(pp, runs, false)
	pp.tag.pause = nil
	pp.tag.remaps++
	return nil
}

// markPausedLocked marks the segments of pp paused or live, takes their
// bytes out of the mapped (reserved) bytes or puts them back, and records
// runs as unmapped or mapped in the history. It returns the bytes.
func (h *Heap) markPausedLocked(pp *privatePool, runs []Run, paused bool) uint64 {
	var n uint64
	for _, st := range pp.states {
		for _, seg := range st.segs {
			seg.paused = paused
			n += seg.mapped
			if paused {
				h.mu.mapped[seg.Pool] -= seg.mapped
			} else {
				h.mu.mapped[seg.Pool] += seg.mapped
			}
		}
	}
	h.syncReservedLocked()
	if h.mu.hist != nil {
		for _, r := range runs {
			if paused {
				h.noteUnmapLocked(r.Seg, r.Ptr, r.Size)
			} else {
				h.noteMapLocked(r.Seg, r.Ptr, r.Size)
			}
		}
	}
	return n
}

// mapRunsLocked maps runs with pr, within the memory limit. When the
// device is out of memory it gives back the whole free pages of the
// shared pools and the page cache, as the OOM policy would, and tries once
// more.
func (h *Heap) mapRunsLocked(pr Pauser, runs []Run) error {
	var size uint64
	for _, r := range runs {
		size += r.Size
	}
	var cached uint64
	for _, p := range poolsOfRuns(runs) {
		cached += h.back.CachedBytes(p)
	}
	if err := h.limitLocked(size - min(size, cached)); err != nil {
		return fmt.Errorf("mapping %d bytes: %w", size, err)
	}
	err := h.pageWorkLocked(func() error { return pr.ResumeRuns(runs, &h.mu.stats) })
	if retryable(err) {
		h.mu.stats.NumAllocRetries++
		if rerr := h.releaseAllLocked(); rerr != nil {
			h.log.Warn("xseg: emptying the cache to resume a tag", "err", rerr)
		}
		err = h.pageWorkLocked(func() error { return pr.ResumeRuns(runs, &h.mu.stats) })
	}
	if err != nil {
		// The pages a failed run took went to the cache: they were made
		// for the tag, give them back to the device.
		return fmt.Errorf("mapping %d bytes: %w", size, errors.Join(err, h.releaseCacheLocked()))
	}
	h.syncReservedLocked()
	return nil
}

func poolsOfRuns(runs []Run) []Pool {
	var pools []Pool
	for _, r := range runs {
		if !slices.Contains(pools, r.Seg.Pool) {
			pools = append(pools, r.Seg.Pool)
		}
	}
	return pools
}

// restoreLocked copies pp's backup back into the blocks still allocated
// at the addresses backed up; blocks freed while paused are skipped.
func (h *Heap) restoreLocked(pp *privatePool) error {
	for ptr, data := range pp.tag.pause.backup {
		if b := h.mu.blocks[ptr]; b == nil || b.state != stAllocated {
			continue
		}
		if err := h.drv.CopyHtoD(ptr, data); err != nil {
			return fmt.Errorf("restoring block %v+%d from the backup: %w", ptr, len(data), err)
		}
	}
	return nil
}

// forgetPausedLocked drops the books of paused tags for Close: every
// block of their segments is freed and each segment becomes one hole,
// which Close gives back (the Backing unmaps stuck pages first).
func (h *Heap) forgetPausedLocked() {
	for _, pp := range h.mu.tags {
		if !pp.paused() {
			continue
		}
		for _, st := range pp.states {
			for _, seg := range st.segs {
				h.holeSegmentLocked(seg)
			}
		}
		pp.tag.pause = nil
	}
}

// holeSegmentLocked frees every block of paused segment seg and makes the
// segment one hole, without calling the driver: its pages are gone.
func (h *Heap) holeSegmentLocked(seg *Seg) {
	h.freeAllLocked(seg)
	h.flush(seg.st)
	for b := seg.first; b != nil; {
		next := b.next
		if b.state == stFree {
			seg.st.removeFree(b)
			delete(h.mu.blocks, b.ptr)
		}
		h.recycle(b)
		b = next
	}
	hole := h.newBlock()
	hole.ptr, hole.size, hole.seg, hole.state = seg.Base, seg.Size, seg, stUnmapped
	seg.first, seg.holes = hole, []*block{hole}
	seg.mapped, seg.paused = 0, false
}
