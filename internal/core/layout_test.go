//go:build !race

package core

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

var layoutSink []any

// TestHotLayout pins what the warm paths of Alloc and Free read and write
// to few cache lines (Heap's doc), at the addresses the Go runtime gives
// a Heap and a state (an object over 512 bytes with pointers starts 8
// bytes into its size class's slot, past the runtime's header, so a line
// of the struct starts at offset 56, 120, ...): the Heap's fixed inputs
// to one line; the lock's warm fields, the warm paths' flags, packing
// and the states of class 0 to the next three; each pool's block
// counters, and the all-pools room, to a line of their own; a state's
// key and counts to one line and its packing context to the next; a
// segment's pool and state to one line. A field moved, or grown, past its
// line fails here rather than slowing the warm pair on a loaded
// machine; so does a runtime that places objects otherwise. (Not under
// the race detector, whose heapLock is a sync.Mutex: heaplock_race.go.)
func TestHotLayout(t *testing.T) {
	const line = 64
	h, st, sg := new(Heap), new(state), new(Seg)
	layoutSink = []any{h, st, sg} // on the heap, as NewHeap makes them
	lineOf := func(p unsafe.Pointer, size uintptr) (first, last uintptr) {
		return uintptr(p) / line, (uintptr(p) + size - 1) / line
	}
	hl, _ := lineOf(unsafe.Pointer(h), 1)
	// in checks that a field lies in line n of the Heap (0: the line
	// its first field is in), or of the object whose line 0 is base.
	in := func(name string, base, n uintptr, p unsafe.Pointer, size uintptr) {
		t.Helper()
		first, last := lineOf(p, size)
		require.Equal(t, [2]uintptr{base + n, base + n}, [2]uintptr{first, last}, "%s: lines %d to %d, want %d", name, first-base, last-base, n)
	}
	in("limit", hl, 0, unsafe.Pointer(&h.limit), 8)
	in("poolMax", hl, 0, unsafe.Pointer(&h.poolMax), unsafe.Sizeof(h.poolMax))
	in("classPage", hl, 0, unsafe.Pointer(&h.classPage), unsafe.Sizeof(h.classPage))
	in("packFrom", hl, 0, unsafe.Pointer(&h.packFrom), unsafe.Sizeof(h.packFrom))
	in("whole", hl, 0, unsafe.Pointer(&h.whole), 1)
	m := &h.mu
	in("lock bias", hl, 1, unsafe.Pointer(&m.bias), 8)
	in("lock revoke", hl, 1, unsafe.Pointer(&m.revoke), 4)
	in("lock byBias", hl, 1, unsafe.Pointer(&m.byBias), 1)
	for _, f := range []struct {
		name string
		p    unsafe.Pointer
		size uintptr
	}{
		{"closed", unsafe.Pointer(&m.closed), 1}, {"quiet", unsafe.Pointer(&m.quiet), 1},
		{"plain", unsafe.Pointer(&m.plain), 1}, {"shape", unsafe.Pointer(&m.shape), 8},
		{"lastStream", unsafe.Pointer(&m.lastStream), 8}, {"freeSeq", unsafe.Pointer(&m.freeSeq), 8},
		{"freed", unsafe.Pointer(&m.freed), 8}, {"hist", unsafe.Pointer(&m.hist), 8},
	} {
		in(f.name, hl, 2, f.p, f.size)
	}
	in("pack", hl, 3, unsafe.Pointer(&m.pack), unsafe.Sizeof(m.pack))
	in("def of class 0", hl, 3, unsafe.Pointer(&m.def[0]), unsafe.Sizeof(m.def[0]))
	s := &m.bstats
	for p := range s.pools {
		ps := &s.pools[p]
		require.Zero(t, uintptr(unsafe.Pointer(ps))%line, "pool %d's counters start a line", p)
		pl, _ := lineOf(unsafe.Pointer(ps), 1)
		in("pool counters cur", pl, 0, unsafe.Pointer(&ps.cur), unsafe.Sizeof(ps.cur))
		in("pool counters total", pl, 0, unsafe.Pointer(&ps.total), unsafe.Sizeof(ps.total))
		in("pool room", pl, 0, unsafe.Pointer(&ps.roomBytes), 16)
	}
	require.Zero(t, unsafe.Sizeof(s.pools[0])%line, "a pool's counters are whole lines")
	al, _ := lineOf(unsafe.Pointer(&s.allRoomBytes), 1)
	in("all room", al, 0, unsafe.Pointer(&s.allRoomBytes), 16)
	in("all peaks", al, 0, unsafe.Pointer(&s.allPeak), unsafe.Sizeof(s.allPeak))

	sl, _ := lineOf(unsafe.Pointer(st), 1)
	in("state key", sl, 0, unsafe.Pointer(&st.key), unsafe.Sizeof(st.key))
	in("state exactN", sl, 0, unsafe.Pointer(&st.exactN), 8)
	in("state freeBytes", sl, 0, unsafe.Pointer(&st.freeBytes), 8)
	in("state shared", sl, 0, unsafe.Pointer(&st.shared), 1)
	in("state lastLarge", sl, 1, unsafe.Pointer(&st.lastLarge), unsafe.Sizeof(st.lastLarge))
	in("state packKey", sl, 1, unsafe.Pointer(&st.packKey), 8)

	gl, _ := lineOf(unsafe.Pointer(&sg.Pool), 8)
	in("segment state", gl, 0, unsafe.Pointer(&sg.st), 8)
	for range 8 { // a block is two lines, whichever way it is allocated
		b := new(block)
		layoutSink = append(layoutSink, b)
		require.Zero(t, uintptr(unsafe.Pointer(b))%line, "a block starts a line")
	}
}
