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
// words; blockStats keeps only what cannot be derived, and a warm Alloc
// adds to six, a warm Free to three (besides the room below the peaks):
//   - the all-pools current, allocated and freed values are sums over the
//     pools;
//   - freed is allocated less what current gained since the last
//     ResetAccumulatedStats (base holds current then), so a Free only
//     lowers current;
//   - the active counters are the allocated ones plus what pending blocks
//     hold, which only the slow paths change; their allocated totals are
//     those of allocated bytes and allocations: a block becomes active
//     only when handed out.

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
	// They are also the ones kept current one by one: an active counter
	// is its allocated counter plus what pending blocks hold (poolBlockStats.pend).
	numTotals = hActiveBytes
)

// poolBlockStats are one pool's counters. What a warm Alloc and Free
// move, the current and total values and the room, comes first and fills
// one cache line (TestHotLayout); the struct is padded to whole lines.
type poolBlockStats struct {
	// cur holds the current values of the first numTotals counters.
	// pend holds the bytes and blocks freed but still active (pending
	// the events of other streams): active bytes are cur[hAllocBytes] +
	// pend[0], active blocks cur[hAllocs] + pend[1]. A block handed out
	// or freed at once moves the allocated counters only.
	cur   [numTotals]int64
	total [numTotals]int64
	// roomBytes and roomCount are lower bounds on how far each byte
	// counter and each count of the pool is below its peak: while a
	// block fits in them, no peak can rise, and handOut makes one
	// comparison of each instead of ten of the peaks. They are 0 (no
	// room known) until a handOut measures them, and again after
	// resetPeaks. blockStats keeps those of all pools.
	roomBytes, roomCount int64
	pend                 [2]int64
	peak                 [numHot]int64
	base                 [numHot]int64 // current at the last ResetAccumulatedStats
	_                    [4]int64
}

// current returns the current values of all five counters.
func (ps *poolBlockStats) current() [numHot]int64 {
	c := &ps.cur
	return [numHot]int64{c[hAllocBytes], c[hReqBytes], c[hAllocs], c[hAllocBytes] + ps.pend[0], c[hAllocs] + ps.pend[1]}
}

type blockStats struct {
	pools [NumPools]poolBlockStats
	// allRoomBytes and allRoomCount are the room of all pools (see
	// poolBlockStats.roomBytes), in one cache line with allPeak, the
	// all-pools peaks; the all-pools current values are the sums of
	// the pools' (allCurrent).
	allRoomBytes, allRoomCount int64
	allPeak                    [numHot]int64
	// shadow, under the build tag invariants only, counts the same in
	// spec.Stats' own way, for verifyLocked to compare with fold.
	shadow Stats
}

// allCurrent returns the all-pools current values.
func (s *blockStats) allCurrent() [numHot]int64 {
	var a [numHot]int64
	for p := range s.pools {
		c := s.pools[p].current()
		for i := range a {
			a[i] += c[i]
		}
	}
	return a
}

// handOut counts a block of size bytes of pool p handed out for a request
// of req bytes. Its three steps are inlined where it is called; Alloc's
// warm path takes them itself, as handOut is too large to be inlined.
func (s *blockStats) handOut(p Pool, size, req uint64) {
	s.count(p, size, req)
	if !s.takeRoom(p, int64(size)) {
		s.raisePeaks(p)
	}
	if invariantsOn {
		s.shadowHandOut(p, size, req)
	}
}

// count adds a block of size bytes, handed out for req bytes, to the
// current and total values of pool p.
func (s *blockStats) count(p Pool, size, req uint64) {
	ps := &s.pools[p]
	n, r := int64(size), int64(req)
	ps.cur[hAllocBytes] += n
	ps.cur[hReqBytes] += r
	ps.cur[hAllocs]++
	ps.total[hAllocBytes] += n
	ps.total[hReqBytes] += r
	ps.total[hAllocs]++
}

// takeRoom takes n bytes and one count from the room of pool p and of
// all pools, and reports whether they had it: the bytes counters rose by
// n or r <= n, the counts by 1, so no peak can have risen. Otherwise it
// changes nothing and a peak may have to rise (raisePeaks).
func (s *blockStats) takeRoom(p Pool, n int64) bool {
	ps := &s.pools[p]
	if n > ps.roomBytes || n > s.allRoomBytes || ps.roomCount <= 0 || s.allRoomCount <= 0 {
		return false
	}
	ps.roomBytes -= n
	s.allRoomBytes -= n
	ps.roomCount--
	s.allRoomCount--
	return true
}

// shadowHandOut is handOut's count in spec.Stats' own way (build tag
// invariants).
func (s *blockStats) shadowHandOut(p Pool, size, req uint64) {
	sh := &s.shadow
	sh.AllocatedBytes.Inc(p, size)
	sh.RequestedBytes.Inc(p, req)
	sh.ActiveBytes.Inc(p, size)
	sh.Allocations.Inc(p, 1)
	sh.ActiveBlocks.Inc(p, 1)
}

// raisePeaks raises the peaks of pool p and of all pools to the current
// values, and measures their room.
func (s *blockStats) raisePeaks(p Pool) {
	c, a := s.pools[p].current(), s.allCurrent()
	pk, ap := &s.pools[p].peak, &s.allPeak
	for i := range numHot {
		raise(&pk[i], c[i])
		raise(&ap[i], a[i])
	}
	s.pools[p].roomBytes, s.pools[p].roomCount = roomOf(pk, &c)
	s.allRoomBytes, s.allRoomCount = roomOf(ap, &a)
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
// bytes, freed but still active (pending); deactivate counts it no longer
// active.
func (s *blockStats) unallocate(p Pool, size, req uint64) {
	ps := &s.pools[p]
	ps.lower(size, req)
	ps.pend[0] += int64(size)
	ps.pend[1]++
	if invariantsOn {
		sh := &s.shadow
		sh.AllocatedBytes.Dec(p, size)
		sh.RequestedBytes.Dec(p, req)
		sh.Allocations.Dec(p, 1)
	}
}

// lower takes a block of size bytes, handed out for req bytes, out of
// the allocated counters.
func (ps *poolBlockStats) lower(size, req uint64) {
	c := &ps.cur
	c[hAllocBytes] -= int64(size)
	c[hReqBytes] -= int64(req)
	c[hAllocs]--
}

// free counts a block handed out for req bytes freed and no longer
// active at once: every counter of pool p and of all pools falls by at
// least req bytes or 1, and so their room grows by as much.
func (s *blockStats) free(p Pool, size, req uint64) {
	ps := &s.pools[p]
	ps.lower(size, req)
	ps.roomBytes += int64(req)
	s.allRoomBytes += int64(req)
	ps.roomCount++
	s.allRoomCount++
	if invariantsOn {
		sh := &s.shadow
		sh.AllocatedBytes.Dec(p, size)
		sh.RequestedBytes.Dec(p, req)
		sh.Allocations.Dec(p, 1)
		sh.ActiveBytes.Dec(p, size)
		sh.ActiveBlocks.Dec(p, 1)
	}
}

func (s *blockStats) deactivate(p Pool, size uint64) {
	ps := &s.pools[p]
	ps.pend[0] -= int64(size)
	ps.pend[1]--
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
	var cur [NumPools][numHot]int64
	for p := range NumPools {
		cur[p] = s.pools[p].current()
	}
	allCur := s.allCurrent()
	for i, ps := range out {
		all := Stat{Current: allCur[i], Peak: s.allPeak[i]}
		for p := range NumPools {
			b := &s.pools[p]
			v := Stat{Current: cur[p][i], Peak: b.peak[i], Allocated: totalOf(b, i)}
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
		s.pools[p].peak = s.pools[p].current()
	}
	s.allPeak = s.allCurrent()
	for p := range s.pools {
		s.pools[p].roomBytes, s.pools[p].roomCount = 0, 0
	}
	s.allRoomBytes, s.allRoomCount = 0, 0
	if invariantsOn {
		s.shadow.ResetPeaks()
	}
}

// resetAccumulated zeroes the allocated and freed totals.
func (s *blockStats) resetAccumulated() {
	for p := range s.pools {
		ps := &s.pools[p]
		ps.total = [numTotals]int64{}
		ps.base = ps.current()
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
		peak, cur, rb, rc := &s.allPeak, s.allCurrent(), s.allRoomBytes, s.allRoomCount
		if p < NumPools {
			ps := &s.pools[p]
			peak, cur, rb, rc = &ps.peak, ps.current(), ps.roomBytes, ps.roomCount
		}
		b, c := roomOf(peak, &cur)
		if rb > b || rc > c || rb < 0 || rc < 0 {
			return fmt.Errorf("room %d: %d bytes and %d blocks kept, but counters are %d bytes and %d blocks under their peaks", p, rb, rc, b, c)
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
