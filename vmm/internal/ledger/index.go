package ledger

import (
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// The mapping index. Mappings start on a granule and cover whole granules,
// so each reservation keeps, for each of its granules, which mapping covers
// it: the slot of the granule holds the mapping's index in Ledger.maps plus
// one, or 0 where nothing is mapped. A mapping of n granules fills n slots.
// Lookup is then a search among the few reservations and one array read;
// checking that a range is free, or walking the mappings of a run, reads
// consecutive slots.
//
// The slots of a reservation are cut into chunks of chunkLen granules,
// allocated when a granule of theirs is first mapped and let go when their
// last mapping goes, so a reservation costs memory in proportion to what is
// mapped in it (plus a directory of one word a chunk, made at its first
// map). A reservation of more than maxDense chunks (16 TiB of 2 MiB
// granules) keeps its chunks in a map instead of a directory.

const (
	chunkShift = 9
	chunkLen   = 1 << chunkShift // granules a chunk
	chunkMask  = chunkLen - 1
	maxDense   = 1 << 14 // chunks a reservation may index by directory
	maxSpare   = 4       // empty chunks kept for reuse
)

// chunk holds the slots of chunkLen consecutive granules.
type chunk struct {
	slot [chunkLen]uint32
	used int // slots that are not 0
}

// reservation is a reserved range and the index of its mappings.
type reservation struct {
	ptr      vmm.DevicePtr
	size     uint64
	granules uint64
	mappings int      // live mappings in the range
	dir      []*chunk // chunk i at dir[i]; nil until the first map
	sparse   map[uint64]*chunk
}

// contains reports whether ptr lies in r.
func (r *reservation) contains(ptr vmm.DevicePtr) bool {
	return ptr >= r.ptr && uint64(ptr-r.ptr) < r.size
}

// chunk returns chunk i, or nil if none of its granules is mapped.
func (r *reservation) chunk(i uint64) *chunk {
	if r.dir != nil {
		return r.dir[i]
	}
	return r.sparse[i] // nil map: nil
}

// slot returns the slot of granule g.
func (r *reservation) slot(g uint64) uint32 {
	c := r.chunk(g >> chunkShift)
	if c == nil {
		return 0
	}
	return c.slot[g&chunkMask]
}

// cursor reads the slots of a reservation, keeping the chunk it read
// last at hand, for walks over consecutive granules.
type cursor struct {
	r *reservation
	i uint64 // index of c, if c is not nil
	c *chunk
}

// slot returns the slot of granule g.
func (k *cursor) slot(g uint64) uint32 {
	if i := g >> chunkShift; k.c == nil || i != k.i {
		if k.c, k.i = k.r.chunk(i), i; k.c == nil {
			return 0
		}
	}
	return k.c.slot[g&chunkMask]
}

// walk steps through the granules of a run of mappings, which may go on
// into an adjacent reservation.
type walk struct {
	l  *Ledger
	k  cursor
	at vmm.DevicePtr // the granule at hand
}

// slot returns the slot of the granule at w.at, 0 if it is not mapped or
// not reserved.
func (w *walk) slot() uint32 {
	r := w.k.r
	if r == nil || !r.contains(w.at) {
		if r = w.l.rangeAt(w.at); r == nil {
			return 0
		}
		w.k = cursor{r: r}
	}
	return w.k.slot(uint64(w.at-r.ptr) >> w.l.shift)
}

// isFree reports whether the granules [g, g+n) are all unmapped.
func (r *reservation) isFree(g, n uint64) bool {
	for end := g + n; g < end; {
		i, lo := g>>chunkShift, g&chunkMask
		hi := min(uint64(chunkLen), lo+(end-g))
		if c := r.chunk(i); c != nil {
			for _, s := range c.slot[lo:hi] {
				if s != 0 {
					return false
				}
			}
		}
		g += hi - lo
	}
	return true
}

// fill sets the slots of the granules [g, g+n) to v: from 0 to a mapping's
// slot (they are all 0), or back to 0 (they all hold one mapping's slot).
func (l *Ledger) fill(r *reservation, g, n uint64, v uint32) {
	for end := g + n; g < end; {
		i, lo := g>>chunkShift, g&chunkMask
		hi := min(uint64(chunkLen), lo+(end-g))
		c := r.chunk(i)
		if c == nil {
			c = l.newChunk(r, i)
		}
		s := c.slot[lo:hi]
		for k := range s {
			s[k] = v
		}
		if v != 0 {
			c.used += len(s)
		} else if c.used -= len(s); c.used == 0 {
			l.dropChunk(r, i, c)
		}
		g += hi - lo
	}
}

// newChunk makes chunk i of r, reusing a spare one.
func (l *Ledger) newChunk(r *reservation, i uint64) *chunk {
	var c *chunk
	if n := len(l.spare); n > 0 {
		c, l.spare = l.spare[n-1], l.spare[:n-1]
	} else {
		c = new(chunk)
	}
	nchunks := (r.granules + chunkMask) >> chunkShift
	switch {
	case r.dir != nil:
	case nchunks <= maxDense:
		r.dir = make([]*chunk, nchunks)
	case r.sparse == nil:
		r.sparse = make(map[uint64]*chunk)
	}
	if r.dir != nil {
		r.dir[i] = c
	} else {
		r.sparse[i] = c
	}
	return c
}

// dropChunk lets go of chunk i of r, now empty (all its slots are 0).
func (l *Ledger) dropChunk(r *reservation, i uint64, c *chunk) {
	if r.dir != nil {
		r.dir[i] = nil
	} else {
		delete(r.sparse, i)
	}
	if len(l.spare) < maxSpare {
		l.spare = append(l.spare, c)
	}
}

// rangeAt returns the reservation that contains ptr, or nil.
func (l *Ledger) rangeAt(ptr vmm.DevicePtr) *reservation {
	if r := l.last; r != nil && r.contains(ptr) {
		return r
	}
	// The last reservation that starts at or before ptr.
	i, found := slices.BinarySearchFunc(l.ranges, ptr, byStart)
	if !found {
		i--
	}
	if i < 0 || !l.ranges[i].contains(ptr) {
		return nil
	}
	l.last = l.ranges[i]
	return l.last
}

// rangeOf returns the reservation that contains all of [ptr, ptr+size),
// size > 0, and the index of ptr's granule in it.
func (l *Ledger) rangeOf(ptr vmm.DevicePtr, size uint64) (*reservation, uint64, bool) {
	r := l.rangeAt(ptr)
	if r == nil {
		return nil, 0, false
	}
	off := uint64(ptr - r.ptr)
	if size > r.size-off {
		return nil, 0, false
	}
	return r, off >> l.shift, true
}

// at returns the mapping whose slot is s (not 0).
func (l *Ledger) at(s uint32) *mapRec { return &l.maps[s-1] }

// slotAt returns the slot of the mapping that contains ptr, or 0.
func (l *Ledger) slotAt(ptr vmm.DevicePtr) uint32 {
	r := l.rangeAt(ptr)
	if r == nil {
		return 0
	}
	return r.slot(uint64(ptr-r.ptr) >> l.shift)
}

// mappingsIn counts the mappings that overlap the granules [g, g+n) of r.
func (l *Ledger) mappingsIn(r *reservation, g, n uint64) int {
	count, last := 0, uint32(0)
	for end := g + n; g < end; {
		c := r.chunk(g >> chunkShift)
		if c == nil { // skip the whole chunk
			g = (g | chunkMask) + 1
			continue
		}
		if s := c.slot[g&chunkMask]; s != 0 && s != last {
			count, last = count+1, s
		}
		g++
	}
	return count
}
