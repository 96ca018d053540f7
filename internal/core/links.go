package core

import "slices"

// splitAt cuts b at off bytes from its start and returns the second part,
// a new block of the same state linked after b. Blocks other than holes go
// into the ptr map.
func (h *Heap) splitAt(b *block, off uint64) *block {
	r := h.newBlock()
	r.ptr, r.size, r.seg, r.state, r.freed, r.cycles = b.ptr.Add(off), b.size-off, b.seg, b.state, b.freed, b.cycles
	if b.state == stAllocated || b.state == stPending {
		r.state = stFree
	}
	b.size = off
	r.prev, r.next = b, b.next
	if b.next != nil {
		b.next.prev = r
	}
	b.next = r
	if r.state != stUnmapped {
		h.mu.blocks[r.ptr] = r
	}
	return r
}

// unlink takes b, which a neighbour has absorbed, out of its segment's
// list and the ptr map, and recycles it.
func (h *Heap) unlink(b *block) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		b.seg.first = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	}
	if b.state != stUnmapped {
		delete(h.mu.blocks, b.ptr)
	}
	h.recycle(b)
}

// coalesce merges free block b (in no free structure) with its free
// neighbours in the best-fit tree and puts the result in the tree.
func (h *Heap) coalesce(b *block) *block {
	st := b.seg.st
	if p := b.prev; p.isFreeIn() {
		st.removeFree(p)
		p.size += b.size
		p.freed = max(p.freed, b.freed)
		h.unlink(b)
		b = p
	}
	if n := b.next; n.isFreeIn() {
		st.removeFree(n)
		b.size += n.size
		b.freed = max(b.freed, n.freed)
		h.unlink(n)
	}
	st.insertFree(b)
	return b
}

// flush coalesces every block of st's exact-size lists (those filled
// since the last flush: the others are empty).
func (h *Heap) flush(st *state) {
	if st.exactN == 0 {
		return
	}
	for _, l := range st.filled {
		l.filled = false
		b := l.head
		l.head = nil
		for b != nil {
			nx := b.nextExact
			b.nextExact, b.inExact = nil, false
			st.exactN--
			st.freeBytes -= b.size
			h.coalesce(b)
			b = nx
		}
	}
	clear(st.filled)
	st.filled = st.filled[:0]
	if len(st.exact) > maxSizes {
		st.dropLists()
	}
}

// addHole makes b, just unmapped, a hole of its segment, merged with the
// holes next to it, and returns the merged hole.
func (h *Heap) addHole(b *block) *block {
	seg := b.seg
	if b.state != stUnmapped {
		delete(h.mu.blocks, b.ptr)
		b.state = stUnmapped
	}
	if p := b.prev; p != nil && p.state == stUnmapped {
		p.size += b.size
		p.cycles = max(p.cycles, b.cycles)
		h.unlink(b)
		b = p
	} else {
		i, _ := slices.BinarySearchFunc(seg.holes, b, cmpPtr)
		seg.holes = slices.Insert(seg.holes, i, b)
	}
	if n := b.next; n != nil && n.state == stUnmapped {
		b.size += n.size
		b.cycles = max(b.cycles, n.cycles)
		h.removeHole(n)
		h.unlink(n)
	}
	return b
}

func (h *Heap) removeHole(b *block) {
	seg := b.seg
	i, ok := slices.BinarySearchFunc(seg.holes, b, cmpPtr)
	if !ok {
		panic("core: hole not in its segment's list")
	}
	seg.holes = slices.Delete(seg.holes, i, i+1)
}

func cmpPtr(a, b *block) int {
	switch {
	case a.ptr < b.ptr:
		return -1
	case a.ptr > b.ptr:
		return 1
	}
	return 0
}
