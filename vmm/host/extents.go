package host

import (
	"fmt"
	"sort"
)

// extent is a run of bytes [off, off+size) of an arena file.
type extent struct{ off, size uint64 }

func (e extent) end() uint64 { return e.off + e.size }

// freeList is the free space of an arena: extents sorted by offset, never
// touching (adjacent free extents are merged), so that the list stays as
// short as the free space is fragmented. It is not safe for concurrent use.
type freeList struct {
	ext []extent
	// hint is where the last extent taken ended: the next page is placed
	// there if it is free, so that pages created one after another lie one
	// after another in the file, and mapping them one after another at
	// ascending addresses lets the kernel merge the mappings into one VMA.
	hint uint64
}

// take removes size bytes from the free list and returns their offset: at the
// hint if that run is free, else at the lowest offset that fits. ok is false
// when no free extent is large enough.
func (f *freeList) take(size uint64) (off uint64, ok bool) {
	i := f.find(f.hint)
	if i >= 0 && f.hint+size <= f.ext[i].end() {
		return f.carve(i, f.hint, size), true
	}
	for i, e := range f.ext {
		if e.size >= size {
			return f.carve(i, e.off, size), true
		}
	}
	return 0, false
}

// find returns the index of the free extent that contains off, or -1.
func (f *freeList) find(off uint64) int {
	i := sort.Search(len(f.ext), func(i int) bool { return f.ext[i].end() > off })
	if i < len(f.ext) && f.ext[i].off <= off {
		return i
	}
	return -1
}

// carve cuts [off, off+size) out of free extent i, which contains it.
func (f *freeList) carve(i int, off, size uint64) uint64 {
	e := f.ext[i]
	head := extent{e.off, off - e.off}
	tail := extent{off + size, e.end() - off - size}
	switch {
	case head.size == 0 && tail.size == 0:
		f.ext = append(f.ext[:i], f.ext[i+1:]...)
	case head.size == 0:
		f.ext[i] = tail
	case tail.size == 0:
		f.ext[i] = head
	default:
		f.ext[i] = head
		f.ext = append(f.ext[:i+1], append([]extent{tail}, f.ext[i+1:]...)...)
	}
	f.hint = off + size
	return off
}

// give returns [off, off+size) to the free list, merging it with its free
// neighbours. Giving back bytes that are already free is a bug of the
// caller; give panics rather than hand the same bytes out twice.
func (f *freeList) give(off, size uint64) {
	e := extent{off, size}
	i := sort.Search(len(f.ext), func(i int) bool { return f.ext[i].off >= off })
	if (i > 0 && f.ext[i-1].end() > off) || (i < len(f.ext) && e.end() > f.ext[i].off) {
		panic(fmt.Sprintf("host: arena extent [%d, %d) is already free", off, e.end()))
	}
	mergePrev := i > 0 && f.ext[i-1].end() == off
	mergeNext := i < len(f.ext) && f.ext[i].off == e.end()
	switch {
	case mergePrev && mergeNext:
		f.ext[i-1].size += size + f.ext[i].size
		f.ext = append(f.ext[:i], f.ext[i+1:]...)
	case mergePrev:
		f.ext[i-1].size += size
	case mergeNext:
		f.ext[i] = extent{off, size + f.ext[i].size}
	default:
		f.ext = append(f.ext, extent{})
		copy(f.ext[i+1:], f.ext[i:])
		f.ext[i] = e
	}
}

// free is the number of free bytes.
func (f *freeList) free() uint64 {
	var n uint64
	for _, e := range f.ext {
		n += e.size
	}
	return n
}
