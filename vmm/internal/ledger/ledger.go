// Package ledger keeps the books of a vmm backend: which address ranges are
// reserved, which physical pages exist, which parts of the ranges are mapped
// to which pages, and which plain allocations, streams and events are live.
//
// Every backend consults the ledger before it calls the system underneath it,
// so the rules of the address-range state machine (see package vmm) are
// enforced the same way everywhere and a misuse is answered with vmm.ErrInvalid
// or vmm.ErrInUse instead of reaching the CUDA driver or the kernel.
//
// The operations that change state come in pairs, Begin and Undo: Begin
// checks the rule and records the new state at once (so that two goroutines
// cannot both pass the check), the backend then makes the system call, and on
// failure calls Undo to put the books back. No lock is held across a system
// call. A Ledger is safe for concurrent use.
package ledger

import (
	"fmt"
	"sync"

	"github.com/google/btree"

	"github.com/xseg-dev/xseg/vmm"
)

// Page is a live physical page.
type Page struct {
	Handle vmm.Handle
	Device vmm.Device
	Size   uint64
	Types  vmm.HandleType
	maps   int // live mappings of this page
	// bound: Size is only an upper bound (an imported page whose size the
	// driver does not report); mappings from offset 0 up to Size pass the
	// books and the driver checks the real size.
	bound bool
}

// Mapping is a live mapping of part of a page into a reserved range.
type Mapping struct {
	Ptr    vmm.DevicePtr
	Size   uint64
	Handle vmm.Handle
	Offset uint64
	Device vmm.Device // the page's device
	// Access holds the access granted by SetAccess, one entry a device.
	Access []vmm.AccessDesc
}

func (m Mapping) end() vmm.DevicePtr { return m.Ptr.Add(m.Size) }

type span struct {
	ptr  vmm.DevicePtr
	size uint64
}

func (s span) end() vmm.DevicePtr { return s.ptr.Add(s.size) }

// Ledger is the book of one backend.
type Ledger struct {
	gran uint64
	mu   sync.Mutex
	// guarded by mu
	ranges *btree.BTreeG[span]
	maps   *btree.BTreeG[*Mapping]
	lo, hi Mapping // search keys, reused so that lookups do not allocate
	// run holds the mappings covering collected last, reused across calls
	// (cleared at the next, dropped when large).
	run []*Mapping
	// granted is the access list SetAccess gave last, shared by every
	// mapping given an equal list (lists are never changed in place), so
	// that granting the same access again allocates nothing.
	granted []vmm.AccessDesc
	pages   map[vmm.Handle]Page // by value: adding a page allocates nothing
	allocs  map[vmm.DevicePtr]uint64
	streams map[vmm.Stream]vmm.Device
	events  map[vmm.Event]vmm.Device
	usage   vmm.Usage
}

// New makes an empty ledger whose pages and mappings are multiples of gran
// bytes, aligned to gran.
func New(gran uint64) *Ledger {
	if gran == 0 || gran&(gran-1) != 0 {
		panic(fmt.Sprintf("ledger: granularity %d is not a power of two", gran))
	}
	return &Ledger{
		gran:    gran,
		ranges:  btree.NewG(16, func(a, b span) bool { return a.ptr < b.ptr }),
		maps:    btree.NewG(16, func(a, b *Mapping) bool { return a.Ptr < b.Ptr }),
		pages:   make(map[vmm.Handle]Page),
		allocs:  make(map[vmm.DevicePtr]uint64),
		streams: make(map[vmm.Stream]vmm.Device),
		events:  make(map[vmm.Event]vmm.Device),
	}
}

// Granularity is the unit of pages and mappings.
func (l *Ledger) Granularity() uint64 { return l.gran }

// CheckSize reports ErrInvalid unless size is a positive multiple of the
// granularity.
func (l *Ledger) CheckSize(what string, size uint64) error {
	if size == 0 || size%l.gran != 0 {
		return fmt.Errorf("%s size %d is not a positive multiple of the granularity %d: %w", what, size, l.gran, vmm.ErrInvalid)
	}
	return nil
}

func (l *Ledger) checkAligned(what string, ptr vmm.DevicePtr, size uint64) error {
	if uint64(ptr)%l.gran != 0 {
		return fmt.Errorf("%s address %v is not aligned to the granularity %d: %w", what, ptr, l.gran, vmm.ErrInvalid)
	}
	if ptr.Add(size) < ptr {
		return fmt.Errorf("%s range %v+%d wraps around: %w", what, ptr, size, vmm.ErrInvalid)
	}
	return l.CheckSize(what, size)
}

// Usage reports what is outstanding.
func (l *Ledger) Usage() vmm.Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usage
}

// AddRange records a range the backend has just reserved.
func (l *Ledger) AddRange(ptr vmm.DevicePtr, size uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ranges.ReplaceOrInsert(span{ptr, size})
	l.usage.Ranges++
	l.usage.RangeBytes += size
}

// BeginUnreserve checks that [ptr, ptr+size) is exactly one reserved range
// with nothing mapped in it and removes it from the books.
func (l *Ledger) BeginUnreserve(ptr vmm.DevicePtr, size uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.ranges.Get(span{ptr: ptr})
	if !ok || r.size != size {
		return fmt.Errorf("unreserving %v+%d: not a reserved range: %w", ptr, size, vmm.ErrInvalid)
	}
	if n := l.mappingsIn(ptr, ptr.Add(size)); n > 0 {
		return fmt.Errorf("unreserving %v+%d: %d mappings remain: %w", ptr, size, n, vmm.ErrInUse)
	}
	l.ranges.Delete(r)
	l.usage.Ranges--
	l.usage.RangeBytes -= size
	return nil
}

// UndoUnreserve puts back a range BeginUnreserve removed.
func (l *Ledger) UndoUnreserve(ptr vmm.DevicePtr, size uint64) { l.AddRange(ptr, size) }

// rangeOf returns the reserved range that contains [ptr, end).
func (l *Ledger) rangeOf(ptr, end vmm.DevicePtr) (span, bool) {
	var r span
	found := false
	l.ranges.DescendLessOrEqual(span{ptr: ptr}, func(s span) bool {
		r, found = s, true
		return false
	})
	if !found || end > r.end() {
		return span{}, false
	}
	return r, true
}

// keys returns the reusable search keys set to ptr and end.
func (l *Ledger) keys(ptr, end vmm.DevicePtr) (*Mapping, *Mapping) {
	l.lo.Ptr, l.hi.Ptr = ptr, end
	return &l.lo, &l.hi
}

// overlaps reports whether a mapping overlaps [ptr, end): the mapping that
// starts last before end (mappings never overlap each other) ends after
// ptr. One descent of the tree, for the hot path of BeginMap.
func (l *Ledger) overlaps(ptr, end vmm.DevicePtr) bool {
	var last *Mapping
	key, _ := l.keys(end-1, 0) // mappings start on granules: <= end-1 is < end
	l.maps.DescendLessOrEqual(key, func(m *Mapping) bool {
		last = m
		return false
	})
	return last != nil && last.end() > ptr
}

// mappingsIn counts the mappings that overlap [ptr, end).
func (l *Ledger) mappingsIn(ptr, end vmm.DevicePtr) int {
	n := 0
	if m := l.mappingAt(ptr); m != nil && m.Ptr < ptr {
		n++
	}
	lo, hi := l.keys(ptr, end)
	l.maps.AscendRange(lo, hi, func(*Mapping) bool { n++; return true })
	return n
}

// mappingAt returns the mapping that contains ptr, or nil.
func (l *Ledger) mappingAt(ptr vmm.DevicePtr) *Mapping {
	var m *Mapping
	lo, _ := l.keys(ptr, 0)
	l.maps.DescendLessOrEqual(lo, func(x *Mapping) bool {
		m = x
		return false
	})
	if m == nil || ptr >= m.end() {
		return nil
	}
	return m
}
