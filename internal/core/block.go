package core

import (
	"fmt"

	"github.com/google/btree"

	"github.com/xseg-dev/xseg/vmm"
)

// MinBlock is the rounding unit of block sizes and the smallest remainder
// a split leaves.
const MinBlock = 512

// RoundSize rounds a request up to a multiple of MinBlock.
func RoundSize(n uint64) uint64 { return (n + MinBlock - 1) &^ (MinBlock - 1) }

type blockState uint8

const (
	stFree      blockState = iota // mapped, not handed out
	stAllocated                   // handed out to a caller
	stPending                     // freed, waiting for events of other streams
	stUnmapped                    // a hole: whole pages with nothing mapped
)

// block is a piece of a segment. Blocks of a segment tile it in address
// order through prev and next. A free block is in exactly one of its
// state's free structures: an exact-size list (inExact) or the best-fit
// tree. Holes are in their segment's holes list. Every block but a hole
// is in the Heap's ptr map.
type block struct {
	ptr        vmm.DevicePtr
	size       uint64
	requested  uint64
	seg        *Seg
	prev, next *block
	nextExact  *block // next of the same exact-size list
	// list is the exact-size list the block was last in or taken from,
	// a hint that spares pushExact a map lookup; it may be stale.
	list   *exactList
	uses   []vmm.Stream
	events int // pending events before a pending block is free
	// freed is the Heap's free sequence number when the block last became
	// free (the largest of the blocks merged into it); 0 for pages mapped
	// since and never handed out. A stream mark whose event completed
	// says every block freed before it is idle (marks.go).
	freed uint64
	// iso is the Heap's shape (heapMu.shape) when the block was last
	// seen isolated; while the shape stays, it still is (popExact).
	iso uint64
	// born is the serial Config.PackLongLived's table recorded this
	// allocation with (pack.go), 0 for any other.
	born  uint64
	state blockState
	// cycles, for a hole, is the most any of its pages went round
	// between a chain growth and recycling (Seg.cycles, chainCycles).
	cycles  uint8
	inExact bool
	// deferred: freed while a pool was active, its stream events not yet
	// recorded (pools.go).
	deferred bool
}

func (b *block) end() vmm.DevicePtr { return b.ptr.Add(b.size) }

func (b *block) isFreeIn() bool { return b != nil && b.state == stFree && !b.inExact }

func lessBySize(a, b *block) bool {
	if a.size != b.size {
		return a.size < b.size
	}
	return a.ptr < b.ptr
}

// stateKey names a (stream, pool) of the shared pools or, with private
// set, of a private pool.
type stateKey struct {
	stream  vmm.Stream
	pool    Pool
	private PoolID
	// class is the size class of the range under Config.SizeClasses
	// (Heap.classOf), 0 otherwise and in private pools.
	class uint8
}

// state holds the segments and free blocks of one (stream, pool).
//
// What the warm paths read and write comes first: the key, the counts of
// parked blocks and free bytes (one cache line), then the packing context
// (the next), then recent, of which each size uses one slot
// (TestHotLayout).
type state struct {
	key stateKey
	// exactN counts the blocks in exact lists (at most maxExact).
	exactN int32
	// shared: the state is of the shared pools (key.private is zero).
	shared bool
	// freeBytes is the size of all free blocks (both structures).
	freeBytes uint64
	// lastLarge are the sizes of the last requests of a page or more
	// under Config.PackLongLived, the latest first (pack.go).
	lastLarge [packContext]uint64
	// packKey is the key's term of packHash, worked out once.
	packKey uint64
	exact   map[uint64]*exactList // freed blocks not yet coalesced, by size
	segs    []*Seg
	free    *btree.BTreeG[*block] // coalesced free blocks by (size, ptr)
	// recent caches lists of exact, direct-mapped by a hash of the size
	// (slotOf), so that the warm path finds a list without a map lookup.
	recent [1 << recentBits]*exactList
	// filled are the lists pushExact found empty since the last flush
	// (each once, exactList.filled): flush walks them, not every size
	// the state has seen.
	filled []*exactList
	pivot  block
}

// exactList is a list of free blocks of one size, through nextExact.
// dead marks a list flush has dropped from its state's map: a block's
// hint to it is then stale.
type exactList struct {
	head   *block
	size   uint64
	dead   bool
	filled bool // in state.filled
}

// recentBits is log2 of the slots of state.recent.
const recentBits = 6

// slotOf is the slot of x, a multiple of MinBlock (a size or an address),
// in a direct-mapped cache of 1<<bits slots: a multiplicative hash, as
// sizes and addresses often differ only in high bits (multiples of a
// page) that a plain modulo would drop.
func slotOf(x uint64, bits uint) uint64 {
	return (x / MinBlock) * 0x9e3779b97f4a7c15 >> (64 - bits)
}

// maxSizes bounds the sizes with an exact-size list; flush forgets them
// beyond it.
const maxSizes = 1024

// maxExact bounds the blocks a state keeps in exact-size lists; beyond it
// a freed block is coalesced at once.
const maxExact = 4096

func newState(k stateKey, fl *btree.FreeListG[*block]) *state {
	return &state{
		key:     k,
		shared:  k.private.IsZero(),
		packKey: packKeyTerm(k),
		exact:   make(map[uint64]*exactList),
		free:    btree.NewWithFreeListG(32, lessBySize, fl),
	}
}

// popExact takes a block of exactly size bytes from the exact lists, if
// the one at the head of its list is isolated, at the Heap's shape shape:
// a block seen isolated at this shape needs no second look at its
// neighbours. Between two changes of the shape only the warm paths have
// run, and they move blocks only between handed out and parked in an
// exact-size list, neither of which stops a neighbour being isolated.
func (s *state) popExact(size, shape uint64) *block {
	l := s.exactList(size)
	if l == nil {
		return nil
	}
	b := l.head
	if b == nil {
		return nil
	}
	if b.iso != shape {
		if !isolated(b) {
			return nil
		}
		b.iso = shape
	} else if invariantsOn && !isolated(b) {
		panic(fmt.Sprintf("xseg: block %v seen isolated at shape %d is not", b.ptr, shape))
	}
	return s.take(l, b)
}

// exactList returns the exact-size list of size, or nil.
func (s *state) exactList(size uint64) *exactList {
	i := slotOf(size, recentBits)
	l := s.recent[i]
	if l == nil || l.size != size {
		if l = s.exact[size]; l == nil {
			return nil
		}
		s.recent[i] = l
	}
	return l
}

// take takes b, the head of l, out of it.
func (s *state) take(l *exactList, b *block) *block {
	l.head = b.nextExact
	b.nextExact, b.inExact, b.list = nil, false, l
	s.exactN--
	s.freeBytes -= b.size
	return b
}

// dropLists forgets every exact-size list; they must be empty.
func (s *state) dropLists() {
	for _, l := range s.exact {
		l.dead = true
	}
	clear(s.exact)
	clear(s.recent[:])
	clear(s.filled)
	s.filled = s.filled[:0]
}

// isolated reports whether no coalesced free block or hole lies next to
// b. Neighbours that are themselves parked in exact-size lists do not
// count: they were freed as blocks of their own sizes, and handing b out
// again at its old place recreates the layout they were freed from (the
// loop of a training step, or of torch_latency.cpp, frees a run of
// adjacent blocks and asks for the same sizes again).
func isolated(b *block) bool {
	return (b.prev == nil || b.prev.state != stFree || b.prev.inExact) &&
		(b.next == nil || b.next.state == stAllocated || b.next.state == stPending ||
			(b.next.state == stFree && b.next.inExact))
}

// pushExact parks a free block in its exact-size list.
func (s *state) pushExact(b *block) {
	l := b.list
	if !l.hintFor(b) {
		l = s.listFor(b)
	}
	s.link(l, b)
}

// hintFor reports whether l, the exact-size list b was last in or taken
// from, is where b goes back as it is: alive, of b's size and listed in
// its state's filled.
func (l *exactList) hintFor(b *block) bool {
	return l != nil && l.filled && !l.dead && l.size == b.size
}

// link puts free block b at the head of l, its exact-size list in s.
func (s *state) link(l *exactList, b *block) {
	b.nextExact = l.head
	b.inExact = true
	l.head = b
	s.exactN++
	s.freeBytes += b.size
}

// listFor returns the exact-size list of b's size, made if need be, and
// makes it b's hint; the list is listed in s.filled.
func (s *state) listFor(b *block) *exactList {
	l := b.list
	if l == nil || l.dead || l.size != b.size {
		if l = s.exact[b.size]; l == nil {
			l = &exactList{size: b.size}
			s.exact[b.size] = l
		}
		b.list = l
	}
	if !l.filled {
		l.filled = true
		s.filled = append(s.filled, l)
	}
	return l
}

// bestFit takes the smallest coalesced free block of at least size bytes,
// judging a block followed by unmapped pages by the size it could grow to:
// a free block before a hole is kept for growth while a bounded block fits.
func (s *state) bestFit(size uint64) *block {
	s.pivot.size, s.pivot.ptr = size, 0
	var found *block
	s.free.AscendGreaterOrEqual(&s.pivot, func(b *block) bool {
		if found != nil && growable(b) >= growable(found) {
			return false
		}
		found = b
		return b.next != nil && b.next.state == stUnmapped
	})
	if found != nil {
		s.removeFree(found)
	}
	return found
}

// lowestFit takes the coalesced free block at the lowest address of at
// least size bytes that ok accepts (Config.PackLongLived), or nil. It
// visits every free block that fits: few, as the requests it serves are
// a page or more.
func (s *state) lowestFit(size uint64, ok func(*block) bool) *block {
	s.pivot.size, s.pivot.ptr = size, 0
	var found *block
	s.free.AscendGreaterOrEqual(&s.pivot, func(b *block) bool {
		if (found == nil || b.ptr < found.ptr) && ok(b) {
			found = b
		}
		return true
	})
	if found != nil {
		s.removeFree(found)
	}
	return found
}

// growable is the size block b could reach by mapping the hole after it.
func growable(b *block) uint64 {
	if n := b.next; n != nil && n.state == stUnmapped {
		return b.size + n.size
	}
	return b.size
}

func (s *state) insertFree(b *block) {
	s.free.ReplaceOrInsert(b)
	s.freeBytes += b.size
}

func (s *state) removeFree(b *block) {
	s.free.Delete(b)
	s.freeBytes -= b.size
}
