package core

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// checkLocked verifies the Heap's books and panics on the first violation:
// blocks tile each segment in address order without overlap, holes are
// whole pages and listed, every free block is in exactly one free
// structure, the ptr map holds exactly the blocks that are not holes, and
// the byte and count statistics equal the sums over the blocks. Tests run it
// after every operation with the build tag invariants; it costs a walk of
// every block.
func (h *Heap) checkLocked() {
	if err := h.verifyLocked(); err != nil {
		panic("xseg core invariant: " + err.Error())
	}
}

type tally struct {
	alloc, active, requested, allocs, actives [NumPools]int64
	blocks                                    int
}

func (h *Heap) verifyLocked() error {
	var t tally
	var mapped [NumPools]uint64
	for _, st := range h.mu.states {
		if err := h.verifyState(st, &t); err != nil {
			return err
		}
		paused := h.mu.pools[st.key.private].paused()
		for _, seg := range st.segs {
			if seg.paused != paused {
				return fmt.Errorf("segment %v+%d paused %v in a pool paused %v", seg.Base, seg.Size, seg.paused, paused)
			}
			if !seg.paused {
				mapped[seg.Pool] += seg.mapped
			}
		}
	}
	if err := h.verifyTagsLocked(); err != nil {
		return err
	}
	if err := h.verifySharedLocked(); err != nil {
		return err
	}
	if err := h.verifyRetiredLocked(); err != nil {
		return err
	}
	if t.blocks != len(h.mu.blocks) {
		return fmt.Errorf("ptr map holds %d blocks, segments %d", len(h.mu.blocks), t.blocks)
	}
	// A slot may hold a block since recycled and reused at another ptr,
	// but an allocated block in it must be the map's (blockLocked).
	for i, b := range h.mu.handed {
		if b != nil && b.state == stAllocated && h.mu.blocks[b.ptr] != b {
			return fmt.Errorf("the handed-out cache holds at slot %d an allocated block %v+%d that is not the ptr map's", i, b.ptr, b.size)
		}
	}
	if mapped != h.mu.mapped {
		return fmt.Errorf("mapped bytes %v, segments say %v", h.mu.mapped, mapped)
	}
	if err := h.mu.bstats.verify(); err != nil {
		return err
	}
	st := h.statsLocked()
	s := &st
	for _, p := range spec.Pools() {
		got := [5]int64{pick(&s.AllocatedBytes, p), pick(&s.ActiveBytes, p), pick(&s.RequestedBytes, p), pick(&s.Allocations, p), pick(&s.ActiveBlocks, p)}
		want := [5]int64{t.alloc[p], t.active[p], t.requested[p], t.allocs[p], t.actives[p]}
		if got != want {
			return fmt.Errorf("%s pool stats (allocated, active, requested bytes; allocations, active blocks) %v, blocks say %v", p, got, want)
		}
		if r := pick(&s.ReservedBytes, p); r != int64(h.mu.mapped[p]+h.back.CachedBytes(p)) {
			return fmt.Errorf("%s pool reserved %d, mapped %d + cached %d", p, r, h.mu.mapped[p], h.back.CachedBytes(p))
		}
	}
	return nil
}

func pick(s *PoolStat, p Pool) int64 {
	return s.Of(p).Current
}

func (h *Heap) verifyState(st *state, t *tally) error {
	exact := 0
	var freeBytes uint64
	for _, l := range st.recent {
		if l != nil && (l.dead || st.exact[l.size] != l) {
			return fmt.Errorf("the recent-list cache holds a list of size %d that is not its state's", l.size)
		}
	}
	queued := 0
	for _, l := range st.filled {
		if !l.filled {
			return fmt.Errorf("the exact list of size %d is queued for flush but not marked", l.size)
		}
		queued++
	}
	marked := 0
	for size, l := range st.exact {
		if l.size != size || l.dead {
			return fmt.Errorf("exact list under size %d says size %d, dead %v", size, l.size, l.dead)
		}
		if l.filled {
			marked++
		} else if l.head != nil {
			return fmt.Errorf("the exact list of size %d holds blocks but flush would not walk it", size)
		}
		for b := l.head; b != nil; b = b.nextExact {
			if !b.inExact || b.state != stFree || b.size != size || b.seg.st != st {
				return fmt.Errorf("block %v+%d in the exact list of size %d is not a free block of its state", b.ptr, b.size, size)
			}
			exact++
			freeBytes += b.size
		}
	}
	if queued != marked {
		return fmt.Errorf("%d exact lists queued for flush, %d marked", queued, marked)
	}
	if exact != int(st.exactN) {
		return fmt.Errorf("exact lists hold %d blocks, count says %d", exact, st.exactN)
	}
	inTree := 0
	st.free.Ascend(func(b *block) bool {
		inTree++
		freeBytes += b.size
		return true
	})
	if freeBytes != st.freeBytes {
		return fmt.Errorf("free structures hold %d bytes, count says %d", freeBytes, st.freeBytes)
	}
	seen := 0
	for _, seg := range st.segs {
		n, err := h.verifySeg(seg, t)
		if err != nil {
			return fmt.Errorf("segment %v+%d: %w", seg.Base, seg.Size, err)
		}
		seen += n
	}
	if seen != exact+inTree {
		return fmt.Errorf("segments hold %d free blocks, free structures %d", seen, exact+inTree)
	}
	return nil
}

// verifySeg checks the tiling of seg and returns its free block count.
func (h *Heap) verifySeg(seg *Seg, t *tally) (int, error) {
	at, free, holes := seg.Base, 0, 0
	var mapped uint64
	var prev *block
	for b := seg.first; b != nil; prev, b = b, b.next {
		switch {
		case b.ptr != at || b.size == 0:
			return 0, fmt.Errorf("block %v+%d where %v was expected", b.ptr, b.size, at)
		case b.prev != prev || b.seg != seg:
			return 0, fmt.Errorf("block %v: bad links", b.ptr)
		case b.size%MinBlock != 0:
			return 0, fmt.Errorf("block %v: size %d not a multiple of %d", b.ptr, b.size, MinBlock)
		}
		at = b.end()
		if b.state == stUnmapped {
			if seg.holes[holes] != b || uint64(b.ptr-seg.Base)%seg.PageSize != 0 || b.size%seg.PageSize != 0 {
				return 0, fmt.Errorf("hole %v+%d not listed or not whole pages", b.ptr, b.size)
			}
			if !seg.allocEdge(b.ptr) || !seg.allocEdge(b.end()) {
				return 0, fmt.Errorf("hole %v+%d splits a physical allocation", b.ptr, b.size)
			}
			holes++
			continue
		}
		mapped += b.size
		t.blocks++
		if h.mu.blocks[b.ptr] != b {
			return 0, fmt.Errorf("block %v not in the ptr map", b.ptr)
		}
		h.tallyBlock(b, t, &free)
	}
	if at != seg.End() || holes != len(seg.holes) || mapped != seg.mapped {
		return 0, fmt.Errorf("blocks end at %v, %d holes of %d listed, %d bytes mapped, %d counted", at, holes, len(seg.holes), mapped, seg.mapped)
	}
	return free, verifyChained(seg)
}

// verifyChained checks the books of chain cycles (pack.go): a page a
// chain growth mapped is mapped, and a hole counts at least the cycles
// of each of its pages.
func verifyChained(seg *Seg) error {
	holeAt := func(i int) *block {
		p := seg.Base.Add(uint64(i) * seg.PageSize)
		j, _ := slices.BinarySearchFunc(seg.holes, p, func(b *block, p vmm.DevicePtr) int { return cmp.Compare(b.ptr, p) })
		if j < len(seg.holes) && seg.holes[j].ptr == p {
			return seg.holes[j]
		}
		if j > 0 && seg.holes[j-1].end() > p {
			return seg.holes[j-1]
		}
		return nil
	}
	for i := range seg.chained {
		if i < 0 || uint64(i)*seg.PageSize >= seg.Size || holeAt(i) != nil {
			return fmt.Errorf("page %d is booked as mapped by a chain growth but is not mapped", i)
		}
	}
	for i, c := range seg.cycles {
		if h := holeAt(i); c == 0 || h != nil && h.cycles < c {
			return fmt.Errorf("page %d: %d chain cycles, its hole counts fewer", i, c)
		}
	}
	return nil
}

func (h *Heap) tallyBlock(b *block, t *tally, free *int) {
	p := b.seg.Pool
	switch b.state {
	case stFree:
		*free++
	case stAllocated:
		t.alloc[p] += int64(b.size)
		t.requested[p] += int64(b.requested)
		t.allocs[p]++
		fallthrough
	case stPending:
		t.active[p] += int64(b.size)
		t.actives[p]++
	}
}

// verifyRetiredLocked checks that every retired run lies in a hole of its
// segment, and that the segments listed as retiring are those with runs.
func (h *Heap) verifyRetiredLocked() error {
	n := 0
	for _, st := range h.mu.states {
		for _, seg := range st.segs {
			if len(seg.retired) == 0 {
				continue
			}
			n++
			if !slices.Contains(h.mu.retiring, seg) {
				return fmt.Errorf("segment %v has retired runs but is not listed as retiring", seg.Base)
			}
			for _, r := range seg.retired {
				for b := seg.first; b != nil; b = b.next {
					if b.state != stUnmapped && b.ptr < r.hi && b.end() > r.lo {
						return fmt.Errorf("retired run %v-%v of segment %v overlaps block %v+%d (state %v)", r.lo, r.hi, seg.Base, b.ptr, b.size, b.state)
					}
				}
			}
		}
	}
	if n != len(h.mu.retiring) {
		return fmt.Errorf("%d segments listed as retiring, %d have retired runs", len(h.mu.retiring), n)
	}
	return nil
}

// verifySharedLocked checks Heap.mu.shared: every state of a shared pool,
// once each, in donorOrder.
func (h *Heap) verifySharedLocked() error {
	n := 0
	for k := range h.mu.states {
		if k.private.IsZero() {
			n++
		}
	}
	if len(h.mu.shared) != n {
		return fmt.Errorf("%d shared states listed for growths, %d in the books", len(h.mu.shared), n)
	}
	for i, st := range h.mu.shared {
		if h.mu.states[st.key] != st {
			return fmt.Errorf("listed shared state %+v is not the books'", st.key)
		}
		if i > 0 && donorOrder(h.mu.shared[i-1], st) >= 0 {
			return fmt.Errorf("shared states %+v and %+v out of order", h.mu.shared[i-1].key, st.key)
		}
	}
	return nil
}
