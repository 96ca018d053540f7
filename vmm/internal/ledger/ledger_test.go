package ledger_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// The ledger never touches memory, so addresses are made up.
const (
	G    = uint64(2 << 20)
	base = vmm.DevicePtr(0x7f00_0000_0000)
)

func at(n uint64) vmm.DevicePtr { return base.Add(n * G) }

// books holds a reservation of 8 granules at base, page 1 of 4 granules,
// pages 2, 3 and 4 of 2 granules, and page 2 mapped at granule 2.
func books(t *testing.T) *ledger.Ledger {
	t.Helper()
	l := ledger.New(G)
	l.AddRange(base, 8*G)
	l.AddPage(1, 0, 4*G, vmm.HandleNone)
	l.AddPage(2, 1, 2*G, vmm.HandlePosixFD)
	l.AddPage(3, 0, 2*G, vmm.HandleNone)
	l.AddPage(4, 0, 2*G, vmm.HandleNone)
	_, err := l.BeginMap(at(2), 2*G, 2, 0)
	require.NoError(t, err)
	return l
}

func TestNewRejectsBadGranularity(t *testing.T) {
	for _, g := range []uint64{0, 3, 3 << 20} {
		require.Panics(t, func() { ledger.New(g) }, "granularity %d", g)
	}
}

func TestBeginMap(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ptr    vmm.DevicePtr
		size   uint64
		h      vmm.Handle
		offset uint64
		err    error
	}{
		{"free space", at(4), 4 * G, 1, 0, nil},
		{"part of a page", at(4), 2 * G, 1, 0, vmm.ErrNotSupported},
		{"second half of a page", at(0), 2 * G, 1, 2 * G, vmm.ErrNotSupported},
		{"right after a mapping", at(4), 4 * G, 1, 0, nil},
		{"right before a mapping", at(0), 2 * G, 2, 0, nil},
		{"misaligned address", at(4) + 4096, G, 1, 0, vmm.ErrInvalid},
		{"zero size", at(4), 0, 1, 0, vmm.ErrInvalid},
		{"size not a multiple", at(4), G + 4096, 1, 0, vmm.ErrInvalid},
		{"misaligned offset", at(4), G, 1, 4096, vmm.ErrInvalid},
		{"past the page", at(4), 2 * G, 1, 3 * G, vmm.ErrInvalid},
		{"unknown page", at(4), G, 9, 0, vmm.ErrInvalid},
		{"before the reservation", base - vmm.DevicePtr(G), G, 1, 0, vmm.ErrInvalid},
		{"across the reservation's end", at(7), 2 * G, 1, 0, vmm.ErrInvalid},
		{"same place as a mapping", at(2), 2 * G, 1, 0, vmm.ErrInvalid},
		{"into a mapping's start", at(1), 2 * G, 1, 0, vmm.ErrInvalid},
		{"into a mapping's middle", at(3), G, 1, 0, vmm.ErrInvalid},
		{"over a mapping", at(0), 4 * G, 1, 0, vmm.ErrInvalid},
		{"wrapping around", vmm.DevicePtr(^uintptr(0) &^ uintptr(G-1)), 2 * G, 1, 0, vmm.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := books(t)
			before := l.Usage()
			m, err := l.BeginMap(tc.ptr, tc.size, tc.h, tc.offset)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				require.Equal(t, before, l.Usage(), "a refused map changes nothing")
				return
			}
			require.NoError(t, err)
			require.Equal(t, before.Mappings+1, l.Usage().Mappings)
			require.Equal(t, before.MappedBytes+tc.size, l.Usage().MappedBytes)
			got, ok := l.Lookup(tc.ptr.Add(tc.size - 1))
			require.True(t, ok)
			require.Equal(t, m, got)
			l.UndoMap(m)
			require.Equal(t, before, l.Usage(), "undone")
		})
	}
}

func TestBeginUnmapNeedsExactCover(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ptr   vmm.DevicePtr
		size  uint64
		count int // mappings removed; 0: refused
	}{
		{"one mapping", at(2), 2 * G, 1},
		{"a run of three", at(0), 6 * G, 3},
		{"a run of two", at(2), 4 * G, 2},
		{"first half of a mapping", at(2), G, 0},
		{"second half of a mapping", at(3), G, 0},
		{"a mapping and half the next", at(2), 3 * G, 0},
		{"nothing mapped", at(6), 2 * G, 0},
		{"run with a gap", at(0), 8 * G, 0},
		{"starts before a mapping", at(1), 3 * G, 0},
		{"misaligned", at(2) + 4096, 2 * G, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := books(t)
			// Mappings at granules [0,2), [2,4) (from books), [4,6).
			_, err := l.BeginMap(at(0), 2*G, 3, 0)
			require.NoError(t, err)
			_, err = l.BeginMap(at(4), 2*G, 4, 0)
			require.NoError(t, err)
			before := l.Usage()
			ms, err := l.BeginUnmap(tc.ptr, tc.size, nil)
			if tc.count == 0 {
				require.ErrorIs(t, err, vmm.ErrInvalid)
				require.Equal(t, before, l.Usage(), "a refused unmap changes nothing")
				return
			}
			require.NoError(t, err)
			require.Len(t, ms, tc.count)
			require.Equal(t, before.Mappings-tc.count, l.Usage().Mappings)
			require.Equal(t, before.MappedBytes-tc.size, l.Usage().MappedBytes)
			_, ok := l.Lookup(tc.ptr)
			require.False(t, ok)
			l.UndoUnmap(ms)
			require.Equal(t, before, l.Usage(), "undone")
			_, ok = l.Lookup(tc.ptr)
			require.True(t, ok)
		})
	}
}

func TestPageAndRangeLifetime(t *testing.T) {
	l := books(t)
	_, err := l.BeginRelease(2)
	require.ErrorIs(t, err, vmm.ErrInUse, "page 2 is mapped")
	require.ErrorIs(t, l.BeginUnreserve(base, 8*G), vmm.ErrInUse, "a mapping remains")
	require.ErrorIs(t, l.BeginUnreserve(base, 4*G), vmm.ErrInvalid, "not the whole range")
	require.ErrorIs(t, l.BeginUnreserve(at(1), 7*G), vmm.ErrInvalid, "not the range's start")

	ms, err := l.BeginUnmap(at(2), 2*G, nil)
	require.NoError(t, err)
	p, err := l.BeginRelease(2)
	require.NoError(t, err, "unmapped: releasable")
	require.Equal(t, ledger.Page{Handle: 2, Device: 1, Size: 2 * G, Types: vmm.HandlePosixFD}, p)
	_, err = l.Page(2)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	l.UndoRelease(p)
	got, err := l.Page(2)
	require.NoError(t, err)
	require.Equal(t, p, got)

	// A failed unmap puts the mapping back and the page is mapped again.
	l.UndoUnmap(ms)
	_, err = l.BeginRelease(2)
	require.ErrorIs(t, err, vmm.ErrInUse)

	_, err = l.BeginUnmap(at(2), 2*G, nil)
	require.NoError(t, err)
	require.NoError(t, l.BeginUnreserve(base, 8*G))
	require.ErrorIs(t, l.BeginUnreserve(base, 8*G), vmm.ErrInvalid, "twice")
	l.UndoUnreserve(base, 8*G)
	require.NoError(t, l.BeginUnreserve(base, 8*G))

	for _, h := range []vmm.Handle{1, 2, 3, 4} {
		_, err = l.BeginRelease(h)
		require.NoError(t, err)
		_, err = l.BeginRelease(h)
		require.ErrorIs(t, err, vmm.ErrInvalid, "released twice")
	}
	require.True(t, l.Usage().Zero(), "%v", l.Usage())
}

func TestSetAccessMerges(t *testing.T) {
	rw := func(d vmm.Device) vmm.AccessDesc { return vmm.AccessDesc{Device: d, Flags: vmm.AccessReadWrite} }
	ro := func(d vmm.Device) vmm.AccessDesc { return vmm.AccessDesc{Device: d, Flags: vmm.AccessRead} }
	none := func(d vmm.Device) vmm.AccessDesc { return vmm.AccessDesc{Device: d, Flags: vmm.AccessNone} }
	for _, tc := range []struct {
		name  string
		calls [][]vmm.AccessDesc
		want  []vmm.AccessDesc
	}{
		{"grant", [][]vmm.AccessDesc{{rw(0)}}, []vmm.AccessDesc{rw(0)}},
		{"second device added", [][]vmm.AccessDesc{{rw(0)}, {ro(1)}}, []vmm.AccessDesc{rw(0), ro(1)}},
		{"downgrade replaces", [][]vmm.AccessDesc{{rw(0)}, {ro(0)}}, []vmm.AccessDesc{ro(0)}},
		{"none removes", [][]vmm.AccessDesc{{rw(0), ro(1)}, {none(0)}}, []vmm.AccessDesc{ro(1)}},
		{"none on nothing", [][]vmm.AccessDesc{{none(3)}}, []vmm.AccessDesc{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := books(t)
			for _, c := range tc.calls {
				_, err := l.SetAccess(at(2), 2*G, c)
				require.NoError(t, err)
			}
			m, ok := l.Lookup(at(2))
			require.True(t, ok)
			require.ElementsMatch(t, tc.want, m.Access)
		})
	}
}

func TestSetAccessRulesAndUndo(t *testing.T) {
	l := books(t)
	_, err := l.BeginMap(at(4), 2*G, 3, 0)
	require.NoError(t, err)
	rw0 := vmm.ReadWrite(0)
	for _, tc := range []struct {
		name   string
		ptr    vmm.DevicePtr
		size   uint64
		access []vmm.AccessDesc
	}{
		{"no descriptors", at(2), 2 * G, nil},
		{"unknown flags", at(2), 2 * G, []vmm.AccessDesc{{Device: 0, Flags: 2}}},
		{"not mapped", at(6), 2 * G, rw0},
		{"partly mapped", at(2), 6 * G, rw0},
		{"half a mapping", at(2), G, rw0},
	} {
		_, err := l.SetAccess(tc.ptr, tc.size, tc.access)
		require.ErrorIs(t, err, vmm.ErrInvalid, tc.name)
	}

	old, err := l.SetAccess(at(2), 4*G, rw0)
	require.NoError(t, err, "a run of two mappings takes one call")
	require.Len(t, old, 2)
	require.NoError(t, l.Accessible(at(2), 4*G, 0, vmm.AccessReadWrite))
	l.UndoAccess(old)
	require.ErrorIs(t, l.Accessible(at(2), 1, 0, vmm.AccessRead), vmm.ErrInvalid, "undone")
}

func TestAccessible(t *testing.T) {
	l := books(t)
	_, err := l.BeginMap(at(4), 2*G, 3, 0)
	require.NoError(t, err)
	_, err = l.SetAccess(at(2), 2*G, vmm.ReadWrite(0))
	require.NoError(t, err)
	_, err = l.SetAccess(at(4), 2*G, []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessRead}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		ptr  vmm.DevicePtr
		n    uint64
		dev  vmm.Device
		want vmm.Access
		ok   bool
	}{
		{"write rw", at(2) + 5, 100, 0, vmm.AccessReadWrite, true},
		{"read rw", at(3), G, 0, vmm.AccessRead, true},
		{"read across both", at(3), 2 * G, 0, vmm.AccessRead, true},
		{"write across both", at(3), 2 * G, 0, vmm.AccessReadWrite, false},
		{"write read-only", at(4), 1, 0, vmm.AccessReadWrite, false},
		{"other device", at(2), 1, 1, vmm.AccessRead, false},
		{"unmapped", at(0), 1, 0, vmm.AccessRead, false},
		{"running off the end", at(5), 2 * G, 0, vmm.AccessRead, false},
	} {
		err := l.Accessible(tc.ptr, tc.n, tc.dev, tc.want)
		if tc.ok {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorIs(t, err, vmm.ErrInvalid, tc.name)
		}
	}
}

func TestAllocsStreamsEvents(t *testing.T) {
	l := ledger.New(G)
	l.AddAlloc(base, 100)
	b, size, ok := l.AllocAt(base + 99)
	require.True(t, ok)
	require.Equal(t, base, b)
	require.Equal(t, uint64(100), size)
	_, _, ok = l.AllocAt(base + 100)
	require.False(t, ok)
	_, err := l.BeginFreeAlloc(base + 1)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	size, err = l.BeginFreeAlloc(base)
	require.NoError(t, err)
	require.Equal(t, uint64(100), size)
	_, err = l.BeginFreeAlloc(base)
	require.ErrorIs(t, err, vmm.ErrInvalid, "twice")

	l.AddStream(7, 1)
	dev, err := l.StreamDevice(7)
	require.NoError(t, err)
	require.Equal(t, vmm.Device(1), dev)
	_, err = l.RemoveStream(7)
	require.NoError(t, err)
	_, err = l.RemoveStream(7)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = l.StreamDevice(7)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	l.AddEvent(9, 0)
	_, err = l.EventDevice(9)
	require.NoError(t, err)
	_, err = l.RemoveEvent(9)
	require.NoError(t, err)
	_, err = l.RemoveEvent(9)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.True(t, l.Usage().Zero(), "%v", l.Usage())
}

// Begin records its state at once: of many goroutines mapping the same
// place, exactly one wins.
func TestBeginMapRace(t *testing.T) {
	l := books(t)
	var wg sync.WaitGroup
	wins := make(chan struct{}, 16)
	for range 16 {
		wg.Go(func() {
			if _, err := l.BeginMap(at(4), 2*G, 3, 0); err == nil {
				wins <- struct{}{}
			}
		})
	}
	wg.Wait()
	require.Len(t, wins, 1)
}

// An imported page's size is only bounded: it maps from offset 0 with any
// size up to the bound, and nothing else.
func TestImportedPageBound(t *testing.T) {
	l := ledger.New(G)
	l.AddRange(base, 8*G)
	l.AddImportedPage(7, 0, 8*G, vmm.HandlePosixFD)
	_, err := l.BeginMap(at(0), 2*G, 7, G)
	require.ErrorIs(t, err, vmm.ErrNotSupported, "an offset")
	m, err := l.BeginMap(at(0), 2*G, 7, 0)
	require.NoError(t, err, "a size below the bound")
	l.UndoMap(m)
	p, err := l.BeginRelease(7)
	require.NoError(t, err)
	l.UndoRelease(p)
	_, err = l.BeginMap(at(0), 3*G, 7, 0)
	require.NoError(t, err, "the bound survives a failed release")
}
