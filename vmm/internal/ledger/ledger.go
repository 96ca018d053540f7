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
	"math/bits"
	"slices"
	"sync"

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

// mapRec is a live mapping in Ledger.maps. Its access list is kept apart
// (Ledger.accs): Mapping.Access is nil here.
type mapRec struct {
	Mapping
	page uint32 // the page's index in Ledger.pageRecs, or noPage
}

// noPage marks a mapping whose page is not live (see UndoUnmap).
const noPage = ^uint32(0)

// Ledger is the book of one backend.
type Ledger struct {
	gran  uint64
	shift uint // log2(gran)
	mu    sync.Mutex
	// guarded by mu
	ranges []*reservation // by address; few
	last   *reservation   // the reservation found last
	spare  []*chunk       // empty chunks for reuse (see index.go)
	// maps holds the live mappings, at the indexes the reservations'
	// slots name; freeMaps lists the indexes not in use. Nothing is
	// allocated per mapping once maps has grown to the number live.
	maps     []mapRec
	freeMaps []uint32
	// pages indexes pageRecs, which holds the live pages by value (so
	// adding a page allocates nothing); freePages lists unused indexes.
	pages     map[vmm.Handle]uint32
	pageRecs  []Page
	freePages []uint32
	// accs[i] is the id of the access list of maps[i] in lists, whose
	// entry 0 is the empty list (see access.go); scratch is reused to merge
	// lists.
	accs    []uint32
	lists   [][]vmm.AccessDesc
	scratch []vmm.AccessDesc
	allocs  map[vmm.DevicePtr]uint64
	// opened are allocations of other processes opened through CUDA's
	// legacy IPC, by base address: their sizes.
	opened  map[vmm.DevicePtr]uint64
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
		shift:   uint(bits.TrailingZeros64(gran)),
		pages:   make(map[vmm.Handle]uint32),
		lists:   [][]vmm.AccessDesc{nil},
		allocs:  make(map[vmm.DevicePtr]uint64),
		opened:  make(map[vmm.DevicePtr]uint64),
		streams: make(map[vmm.Stream]vmm.Device),
		events:  make(map[vmm.Event]vmm.Device),
	}
}

// Granularity is the unit of pages and mappings.
func (l *Ledger) Granularity() uint64 { return l.gran }

// CheckSize reports ErrInvalid unless size is a positive multiple of the
// granularity.
func (l *Ledger) CheckSize(what string, size uint64) error {
	if size == 0 || size&(l.gran-1) != 0 {
		return fmt.Errorf("%s size %d is not a positive multiple of the granularity %d: %w", what, size, l.gran, vmm.ErrInvalid)
	}
	return nil
}

func (l *Ledger) checkAligned(what string, ptr vmm.DevicePtr, size uint64) error {
	if uint64(ptr)&(l.gran-1) != 0 {
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

// AddRange records a range the backend has just reserved. Its index costs
// nothing until something is mapped in it.
func (l *Ledger) AddRange(ptr vmm.DevicePtr, size uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := &reservation{ptr: ptr, size: size, granules: size >> l.shift}
	i, _ := slices.BinarySearchFunc(l.ranges, ptr, byStart)
	l.ranges = slices.Insert(l.ranges, i, r)
	l.usage.Ranges++
	l.usage.RangeBytes += size
}

func byStart(r *reservation, p vmm.DevicePtr) int {
	switch {
	case r.ptr < p:
		return -1
	case r.ptr > p:
		return 1
	}
	return 0
}

// BeginUnreserve checks that [ptr, ptr+size) is exactly one reserved range
// with nothing mapped in it and removes it from the books.
func (l *Ledger) BeginUnreserve(ptr vmm.DevicePtr, size uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := slices.BinarySearchFunc(l.ranges, ptr, byStart)
	if !ok || l.ranges[i].size != size {
		return fmt.Errorf("unreserving %v+%d: not a reserved range: %w", ptr, size, vmm.ErrInvalid)
	}
	r := l.ranges[i]
	if r.mappings > 0 {
		return fmt.Errorf("unreserving %v+%d: %d mappings remain: %w", ptr, size, r.mappings, vmm.ErrInUse)
	}
	// Nothing is mapped, so every chunk is gone: the directory goes with r.
	l.ranges = slices.Delete(l.ranges, i, i+1)
	if l.last == r {
		l.last = nil
	}
	l.usage.Ranges--
	l.usage.RangeBytes -= size
	return nil
}

// UndoUnreserve puts back a range BeginUnreserve removed.
func (l *Ledger) UndoUnreserve(ptr vmm.DevicePtr, size uint64) { l.AddRange(ptr, size) }
