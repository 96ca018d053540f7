package core

import (
	"fmt"
	"time"
)

// The five statistics every Alloc and Free moves (allocated, requested and
// active bytes, allocations, active blocks) live in blockStats rather than
// in Heap.mu.stats, whose fields of them stay zero: statsLocked folds them
// in. Through spec.Stat, which keeps current, peak, allocated and freed for
// each pool and for all of them, an Alloc and a Free each added to twenty
// words; blockStats keeps only what cannot be derived, and an Alloc adds to
// thirteen, a Free to ten:
//   - the all-pools allocated and freed values are sums over the pools
//     (current is kept too, for the peak);
//   - freed is allocated less what current gained since the last
//     ResetAccumulatedStats (base holds current then), so a Free only
//     lowers current;
//   - the active counters' allocated totals are those of allocated bytes
//     and allocations: a block becomes active only when handed out.

// The counters of blockStats, by index.
const (
	hAllocBytes = iota
	hReqBytes
	hAllocs
	hActiveBytes
	hActiveBlocks
	numHot
	// numTotals counts the first counters, those with a total of their
	// own; the active ones share the totals of hAllocBytes and hAllocs.
	numTotals = hActiveBytes
)

// poolBlockStats are one pool's counters.
type poolBlockStats struct {
	cur, peak [numHot]int64
	total     [numTotals]int64
	base      [numHot]int64 // cur at the last ResetAccumulatedStats
}

type blockStats struct {
	pools [NumPools]poolBlockStats
	// allCur and allPeak are the all-pools current values (the sums of
	// the pools') and peaks.
	allCur, allPeak [numHot]int64
	// roomBytes and roomCount are, for each pool and for all of them
	// (index NumPools), lower bounds on how far each byte counter and
	// each count is below its peak: while a block fits in them, no peak
	// can rise, and handOut makes one comparison of each instead of ten
	// of the peaks. They are 0 (no room known) until a handOut measures
	// them, and again after resetPeaks.
	roomBytes, roomCount [NumPools + 1]int64
	// shadow, under the build tag invariants only, counts the same in
	// spec.Stats' own way, for verifyLocked to compare with fold.
	shadow Stats
}

// handOut counts a block of size bytes of pool p handed out for a request
// of req bytes.
func (s *blockStats) handOut(p Pool, size, req uint64) {
	ps := &s.pools[p]
	c := &ps.cur
	n, r := int64(size), int64(req)
	c[hAllocBytes] += n
	c[hReqBytes] += r
	c[hAllocs]++
	c[hActiveBytes] += n
	c[hActiveBlocks]++
	t := &ps.total
	t[hAllocBytes] += n
	t[hReqBytes] += r
	t[hAllocs]++
	a := &s.allCur
	a[hAllocBytes] += n
	a[hReqBytes] += r
	a[hAllocs]++
	a[hActiveBytes] += n
	a[hActiveBlocks]++
	// The bytes counters rise by n or r <= n, the counts by 1.
	rb, rc := &s.roomBytes, &s.roomCount
	if n <= rb[p] && n <= rb[NumPools] && rc[p] > 0 && rc[NumPools] > 0 {
		rb[p] -= n
		rb[NumPools] -= n
		rc[p]--
		rc[NumPools]--
	} else {
		s.raisePeaks(p)
	}
	if invariantsOn {
		sh := &s.shadow
		sh.AllocatedBytes.Inc(p, size)
		sh.RequestedBytes.Inc(p, req)
		sh.ActiveBytes.Inc(p, size)
		sh.Allocations.Inc(p, 1)
		sh.ActiveBlocks.Inc(p, 1)
	}
}

// raisePeaks raises the peaks of pool p and of all pools to the current
// values, and measures their room.
func (s *blockStats) raisePeaks(p Pool) {
	ps := &s.pools[p]
	c, a := &ps.cur, &s.allCur
	pk, ap := &ps.peak, &s.allPeak // unrolled: a loop of five costs more
	raise(&pk[0], c[0])
	raise(&pk[1], c[1])
	raise(&pk[2], c[2])
	raise(&pk[3], c[3])
	raise(&pk[4], c[4])
	raise(&ap[0], a[0])
	raise(&ap[1], a[1])
	raise(&ap[2], a[2])
	raise(&ap[3], a[3])
	raise(&ap[4], a[4])
	s.roomBytes[p], s.roomCount[p] = roomOf(pk, c)
	s.roomBytes[NumPools], s.roomCount[NumPools] = roomOf(ap, a)
}

// roomOf is how far the byte counters of cur, and its counts, are below
// their peaks, the least of each.
func roomOf(peak, cur *[numHot]int64) (bytes, count int64) {
	bytes = min(peak[hAllocBytes]-cur[hAllocBytes], peak[hReqBytes]-cur[hReqBytes], peak[hActiveBytes]-cur[hActiveBytes])
	count = min(peak[hAllocs]-cur[hAllocs], peak[hActiveBlocks]-cur[hActiveBlocks])
	return bytes, count
}

// raise makes peak v if v is above it. It stores only a raised peak:
// most calls raise none.
func raise(peak *int64, v int64) {
	if v > *peak {
		*peak = v
	}
}

// unallocate counts a block of size bytes of pool p, handed out for req
// bytes, freed; deactivate the block no longer active.
func (s *blockStats) unallocate(p Pool, size, req uint64) {
	c, a := &s.pools[p].cur, &s.allCur
	c[hAllocBytes] -= int64(size)
	c[hReqBytes] -= int64(req)
	c[hAllocs]--
	a[hAllocBytes] -= int64(size)
	a[hReqBytes] -= int64(req)
	a[hAllocs]--
	if invariantsOn {
		sh := &s.shadow
		sh.AllocatedBytes.Dec(p, size)
		sh.RequestedBytes.Dec(p, req)
		sh.Allocations.Dec(p, 1)
	}
}

// free is unallocate and deactivate at once, for a block handed out for
// req bytes: every counter of pool p and of all pools falls by at least
// req bytes or 1, and so their room grows by as much.
func (s *blockStats) free(p Pool, size, req uint64) {
	s.unallocate(p, size, req)
	s.deactivate(p, size)
	s.roomBytes[p] += int64(req)
	s.roomBytes[NumPools] += int64(req)
	s.roomCount[p]++
	s.roomCount[NumPools]++
}

func (s *blockStats) deactivate(p Pool, size uint64) {
	c, a := &s.pools[p].cur, &s.allCur
	c[hActiveBytes] -= int64(size)
	c[hActiveBlocks]--
	a[hActiveBytes] -= int64(size)
	a[hActiveBlocks]--
	if invariantsOn {
		s.shadow.ActiveBytes.Dec(p, size)
		s.shadow.ActiveBlocks.Dec(p, 1)
	}
}

// countPair counts a block of size bytes of pool p, handed out for req
// bytes, freed and handed out again for the same request: the totals
// gain, the current values (and so the peaks) stay.
func (s *blockStats) countPair(p Pool, size, req uint64) {
	t := &s.pools[p].total
	t[hAllocBytes] += int64(size)
	t[hReqBytes] += int64(req)
	t[hAllocs]++
	if invariantsOn {
		sh := &s.shadow
		for _, c := range []struct {
			st *PoolStat
			n  uint64
		}{{&sh.AllocatedBytes, size}, {&sh.RequestedBytes, req}, {&sh.Allocations, 1}, {&sh.ActiveBytes, size}, {&sh.ActiveBlocks, 1}} {
			c.st.Dec(p, c.n)
			c.st.Inc(p, c.n)
		}
	}
}

// totalOf is the allocated total of counter i.
func totalOf(ps *poolBlockStats, i int) int64 {
	switch i {
	case hActiveBytes:
		return ps.total[hAllocBytes]
	case hActiveBlocks:
		return ps.total[hAllocs]
	}
	return ps.total[i]
}

// fold writes the counters into st.
func (s *blockStats) fold(st *Stats) {
	out := [numHot]*PoolStat{&st.AllocatedBytes, &st.RequestedBytes, &st.Allocations, &st.ActiveBytes, &st.ActiveBlocks}
	for i, ps := range out {
		all := Stat{Current: s.allCur[i], Peak: s.allPeak[i]}
		for p := range NumPools {
			b := &s.pools[p]
			v := Stat{Current: b.cur[i], Peak: b.peak[i], Allocated: totalOf(b, i)}
			v.Freed = v.Allocated - (v.Current - b.base[i])
			*ps.Of(Pool(p)) = v
			all.Allocated += v.Allocated
			all.Freed += v.Freed
		}
		ps.All = all
	}
}

// resetPeaks makes every peak the current value.
func (s *blockStats) resetPeaks() {
	for p := range s.pools {
		s.pools[p].peak = s.pools[p].cur
	}
	s.allPeak = s.allCur
	s.roomBytes, s.roomCount = [NumPools + 1]int64{}, [NumPools + 1]int64{}
	if invariantsOn {
		s.shadow.ResetPeaks()
	}
}

// resetAccumulated zeroes the allocated and freed totals.
func (s *blockStats) resetAccumulated() {
	for p := range s.pools {
		ps := &s.pools[p]
		ps.total = [numTotals]int64{}
		ps.base = ps.cur
	}
	if invariantsOn {
		s.shadow.ResetAccumulated()
	}
}

// verify compares the folded counters with shadow (build tag invariants).
func (s *blockStats) verify() error {
	var st Stats
	s.fold(&st)
	sh := &s.shadow
	got := [numHot]PoolStat{st.AllocatedBytes, st.RequestedBytes, st.Allocations, st.ActiveBytes, st.ActiveBlocks}
	want := [numHot]PoolStat{sh.AllocatedBytes, sh.RequestedBytes, sh.Allocations, sh.ActiveBytes, sh.ActiveBlocks}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("block statistic %d folds to %+v, counted one by one %+v", i, got[i], want[i])
		}
	}
	for p := range NumPools + 1 {
		peak, cur := &s.allPeak, &s.allCur
		if p < NumPools {
			peak, cur = &s.pools[p].peak, &s.pools[p].cur
		}
		b, c := roomOf(peak, cur)
		if s.roomBytes[p] > b || s.roomCount[p] > c || s.roomBytes[p] < 0 || s.roomCount[p] < 0 {
			return fmt.Errorf("room %d: %d bytes and %d blocks kept, but counters are %d bytes and %d blocks under their peaks", p, s.roomBytes[p], s.roomCount[p], b, c)
		}
	}
	return nil
}

// statsLocked returns the statistics, the block counters folded in.
func (h *Heap) statsLocked() Stats {
	st := h.mu.stats
	h.mu.bstats.fold(&st)
	return st
}

// waitTimedLocked runs wait, a wait on the device, a stream or an event,
// and counts it: Stats.Syncs, and the time it took in Stats.SyncNanos.
func (h *Heap) waitTimedLocked(wait func() error) error {
	t0 := time.Now()
	err := wait()
	h.mu.stats.Syncs++
	h.mu.stats.SyncNanos += int64(time.Since(t0))
	return err
}

// pageWorkLocked runs f, page work of the Backing (mapping, unmapping,
// retiring or releasing pages), and adds the time it took to
// Stats.PageNanos.
func (h *Heap) pageWorkLocked(f func() error) error {
	t0 := time.Now()
	err := f()
	h.mu.stats.PageNanos += int64(time.Since(t0))
	return err
}
