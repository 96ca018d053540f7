package core

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// Retired pages let a growth recycle free pages of its own stream without
// waiting for the stream.
//
// An unmap must wait until no work queued on the pages' stream can touch
// them, or that work faults; under Config.RecyclePages a training loop
// whose growths take pages freed earlier in the same step waited once or
// twice a step, about 1 % of its throughput (bench/RESULTS.md round 17).
// Yet a growth on the same stream needs no wait to use the pages: the work
// it queues runs after the work queued before the free, as with any block
// a caching allocator hands out again. Only the old addresses must stay
// mapped until that earlier work is done. So a steal of pages of the
// growing segment's stream that are not known idle retires them
// (PageRetirer): the Backing puts them in its cache, where the growth maps
// them at their new addresses, while the old ones stay mapped; the Heap
// books the old range as a hole, as any unmap does, and remembers it as a
// retired run. It unmaps the run once the stream's mark has passed the
// free (marks.go): on a later slow path, without waiting; before a growth
// maps into it, waiting for the stream if the mark has not passed (a
// chain growth, pack.go, goes elsewhere rather than wait); and
// before EmptyCache, Close or a capture. Which pages go where is exactly
// as without retiring: only the waits move.
//
// Pages of another stream (RecyclePages takes those too) are still waited
// for: their work is not ordered before the growth's. So are chunks
// (Config.ChunkBytes), which the cache does not keep.
type retiredRun struct {
	lo, hi vmm.DevicePtr
	freed  uint64 // the free sequence number of the block they came from
}

// canRetireLocked reports whether the whole pages [lo, hi) of seg can be
// retired instead of unmapped: the Backing retires pages, nothing
// captures, seg is in a shared pool, and each page is an allocation of
// its own.
func (h *Heap) canRetireLocked(seg *Seg, lo, hi vmm.DevicePtr) bool {
	if h.retirer == nil || h.capturingLocked() || !seg.st.key.private.IsZero() {
		return false
	}
	if seg.bounds == nil {
		return true
	}
	ps := seg.PageSize
	for i := int(uint64(lo-seg.Base) / ps); i < int(uint64(hi-seg.Base)/ps); i++ {
		if _, n := seg.bounds.AllocBounds(seg, i); n > 1 {
			return false
		}
	}
	return true
}

// noteRetiredLocked remembers [lo, hi) of seg, retired from a block freed
// at sequence number freed.
func (h *Heap) noteRetiredLocked(seg *Seg, lo, hi vmm.DevicePtr, freed uint64) {
	if len(seg.retired) == 0 {
		h.mu.retiring = append(h.mu.retiring, seg)
	}
	seg.retired = append(seg.retired, retiredRun{lo: lo, hi: hi, freed: freed})
	h.mu.stats.PagesRetired += int64(uint64(hi-lo) / seg.PageSize)
}

// How settleRetiredLocked treats a run whose free its stream's mark has
// not passed.
type settleMode int

const (
	settleIdle   settleMode = iota // leave it retired
	settleWait                     // wait for the stream, then unmap it
	settleSynced                   // unmap it: the caller waited for the stream or the device
)

// settleRetiredLocked unmaps the retired runs of seg that overlap [lo,
// hi): those whose free the stream's last completed mark has passed, and
// the others as mode says. A run that fails to unmap stays retired (what
// was unmapped of it is gone) and the error says so.
func (h *Heap) settleRetiredLocked(seg *Seg, lo, hi vmm.DevicePtr, mode settleMode) error {
	if len(seg.retired) == 0 {
		return nil
	}
	// The driver is asked about the mark only for a run the last answer
	// does not cover, and only when the caller would wait for it.
	m := h.markLocked(seg.Stream)
	asked := mode != settleWait || h.capturingLocked()
	var errs []error
	unmapped := false
	keep := seg.retired[:0]
	for _, r := range seg.retired {
		if r.hi <= lo || r.lo >= hi {
			keep = append(keep, r)
			continue
		}
		if r.freed >= m.idle && !asked {
			h.refreshMarkLocked(seg.Stream, m)
			asked = true
		}
		if r.freed >= m.idle && mode != settleSynced {
			if err := h.waitRetiredLocked(seg, r, mode); err != nil {
				errs = append(errs, err)
			}
			if r.freed >= m.idle { // not waited for
				keep = append(keep, r)
				continue
			}
		}
		var n uint64
		err := h.pageWorkLocked(func() (err error) {
			n, err = h.retirer.UnmapRetired(seg, r.lo, uint64(r.hi-r.lo), &h.mu.stats)
			return err
		})
		unmapped = unmapped || n > 0
		if err != nil {
			errs = append(errs, fmt.Errorf("unmapping retired pages at %v+%d: %w", r.lo, r.hi-r.lo, err))
			if r.lo = r.lo.Add(n); r.lo < r.hi {
				keep = append(keep, r)
			}
		}
	}
	clear(seg.retired[len(keep):])
	seg.retired = keep
	if len(keep) == 0 {
		h.mu.retiring = slices.DeleteFunc(h.mu.retiring, func(s *Seg) bool { return s == seg })
	}
	if unmapped {
		h.syncReservedLocked() // pages held for their old mapping were released
	}
	if len(errs) > 0 {
		return fmt.Errorf("segment %v: %w", seg.Base, errors.Join(errs...))
	}
	return nil
}

// waitRetiredLocked waits for seg's stream before run r, whose free its
// mark has not passed, is unmapped (settleWait; settleIdle waits for
// nothing). It fails during a capture, which forbids the wait.
func (h *Heap) waitRetiredLocked(seg *Seg, r retiredRun, mode settleMode) error {
	if mode != settleWait {
		return nil
	}
	if h.capturingLocked() {
		return fmt.Errorf("pages at %v+%d, retired while work queued before their free may still run, cannot be waited for during a capture: %w", r.lo, r.hi-r.lo, vmm.ErrInUse)
	}
	if err := h.waitStreamLocked(seg); err != nil {
		return fmt.Errorf("before unmapping retired pages: %w", err)
	}
	return nil
}

// sweepRetiredLocked unmaps the retired runs of stream s whose free the
// stream's mark has passed, without waiting: on the slow path, after the
// mark was asked about.
func (h *Heap) sweepRetiredLocked(s vmm.Stream) {
	for _, seg := range slices.Clone(h.mu.retiring) {
		if seg.Stream != s {
			continue
		}
		if err := h.settleRetiredLocked(seg, seg.Base, seg.End(), settleIdle); err != nil {
			h.log.Warn("xseg: unmapping retired pages", "err", err)
		}
	}
}

// settleAllRetiredLocked unmaps every retired run, waiting for streams as
// needed (synced: the caller waited for the device).
func (h *Heap) settleAllRetiredLocked(synced bool) error {
	mode := settleWait
	if synced {
		mode = settleSynced
	}
	var errs []error
	for _, seg := range slices.Clone(h.mu.retiring) {
		errs = append(errs, h.settleRetiredLocked(seg, seg.Base, seg.End(), mode))
	}
	return errors.Join(errs...)
}

// retiredBusyLocked reports whether mapping [lo, hi) of seg would wait:
// a retired run there was freed after the last mark of seg's stream the
// driver has seen complete. It refreshes the mark twice (the one in
// flight asked about and, once done, a fresh one recorded), then asks
// about the mark in flight, if recorded after the free, for up to
// idlePoll and at least idleTries times: an event recorded on an idle
// stream completes within
// microseconds on a GPU (at once on the host backend), so that only a
// stream still running work queued before the free makes the range busy
// and an idle GPU places blocks as the host does. During a capture
// nothing is asked.
func (h *Heap) retiredBusyLocked(seg *Seg, lo, hi vmm.DevicePtr) bool {
	if len(seg.retired) == 0 {
		return false
	}
	var need uint64
	found := false
	for _, r := range seg.retired {
		if r.hi > lo && r.lo < hi {
			need, found = max(need, r.freed), true
		}
	}
	if !found {
		return false
	}
	m := h.markLocked(seg.Stream)
	for range 2 {
		if need < m.idle || h.capturingLocked() {
			return need >= m.idle
		}
		h.refreshMarkLocked(seg.Stream, m)
	}
	t0 := time.Now()
	for tries := 0; need >= m.idle && m.inFlight && m.seq > need && (tries < idleTries || time.Since(t0) < idlePoll); tries++ {
		h.markPassedLocked(m)
	}
	return need >= m.idle
}

// idlePoll is how long retiredBusyLocked waits for a mark it just
// recorded to complete: enough for an idle GPU to pass it, nothing beside
// the wait for a busy stream it spares (a GPU-bound loop's CPU is
// milliseconds ahead).
const idlePoll = 50 * time.Microsecond

// idleTries is how many times retiredBusyLocked asks about its fresh mark
// at least, however long the asking takes (a thread descheduled between
// two questions would otherwise ask once).
const idleTries = 4
