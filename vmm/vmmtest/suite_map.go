package vmmtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// testMap maps whole pages side by side in one range and one page at two
// places; bytes land on the right page.
func testMap(t *testing.T, c Config) {
	e := open(t, c)
	g := e.gran
	p := e.reserve(4 * g)
	hs := []vmm.Handle{e.create(g, vmm.HandleNone), e.create(2*g, vmm.HandleNone)}
	e.mapRW(p, g, hs[0], 0)
	e.mapRW(p.Add(g), 2*g, hs[1], 0)
	e.write(p.Add(g-1), []byte{1, 2}) // across the two pages
	e.write(p.Add(3*g-1), []byte{3})  // the last byte of the second page
	q := e.reserve(2 * g)
	e.mapRW(q, 2*g, hs[1], 0)
	require.Equal(t, []byte{2}, e.read(q, 1), "first byte of the second page, through another mapping")
	require.Equal(t, []byte{3}, e.read(q.Add(2*g-1), 1), "last byte of the second page, through another mapping")
}

// testMapPart checks that mapping part of a page (an offset, a size below
// the page's) is refused with ErrNotSupported on every backend: CUDA maps
// whole pages only (cuMemMap: offset must be zero), and the host backend
// refuses the same, so code that passes on the host passes on a GPU.
func testMapPart(t *testing.T, c Config) {
	e := open(t, c)
	g := e.gran
	p := e.reserve(4 * g)
	h := e.create(3*g, vmm.HandleNone)
	requireIs(t, e.d.Map(p, g, h, 2*g), vmm.ErrNotSupported, "Map of the last granule of a page")
	requireIs(t, e.d.Map(p, g, h, 0), vmm.ErrNotSupported, "Map of the first granule of a page")
	requireIs(t, e.d.Map(p, 2*g, h, g), vmm.ErrNotSupported, "Map of the tail of a page")
	require.Zero(t, e.d.Usage().Mappings, "a refused Map left a mapping")
	e.mapRW(p, 3*g, h, 0)
	e.write(p.Add(2*g), []byte{42})
	require.Equal(t, []byte{42}, e.read(p.Add(2*g), 1))
	requireIs(t, e.d.Unmap(p, g), vmm.ErrInvalid, "Unmap of part of a mapping")
}

// testMapErrors checks every way Map can be called wrongly.
func testMapErrors(t *testing.T, c Config) {
	e := open(t, c)
	g := e.gran
	p := e.reserve(4 * g)
	h := e.create(2*g, vmm.HandleNone)

	requireIs(t, e.d.Map(p.Add(g/2), 2*g, h, 0), vmm.ErrInvalid, "Map at a misaligned address")
	requireIs(t, e.d.Map(p, g/2, h, 0), vmm.ErrInvalid, "Map of a misaligned size")
	requireIs(t, e.d.Map(p, 0, h, 0), vmm.ErrInvalid, "Map of 0 bytes")
	requireIs(t, e.d.Map(p, g, h, g/2), vmm.ErrInvalid, "Map from a misaligned offset")
	requireIs(t, e.d.Map(p, 3*g, h, 0), vmm.ErrInvalid, "Map of more than the page holds")
	requireIs(t, e.d.Map(p, 2*g, h, g), vmm.ErrInvalid, "Map past the end of the page")
	requireIs(t, e.d.Map(p, g, h, 2*g), vmm.ErrInvalid, "Map from an offset at the end of the page")
	requireIs(t, e.d.Map(p.Add(3*g), 2*g, h, 0), vmm.ErrInvalid, "Map past the end of the reservation")

	dead := e.create(g, vmm.HandleNone)
	require.NoError(t, e.d.Release(dead))
	requireIs(t, e.d.Map(p, g, dead, 0), vmm.ErrInvalid, "Map of a released page")
	requireIs(t, e.d.Map(p, g, vmm.Handle(0x5eed_0000_0bad), 0), vmm.ErrInvalid, "Map of a handle never made")

	q := e.reserve(2 * g)
	require.NoError(t, e.d.Unreserve(q, 2*g))
	requireIs(t, e.d.Map(q, 2*g, h, 0), vmm.ErrInvalid, "Map into an unreserved range")

	e.mapPage(p.Add(g), 2*g, h, 0)
	one := e.create(g, vmm.HandleNone)
	requireIs(t, e.d.Map(p.Add(g), g, one, 0), vmm.ErrInvalid, "Map over the start of a mapping")
	requireIs(t, e.d.Map(p.Add(2*g), g, one, 0), vmm.ErrInvalid, "Map over the end of a mapping")
	requireIs(t, e.d.Map(p, 2*g, h, 0), vmm.ErrInvalid, "Map that overlaps a mapping's start")
	require.Equal(t, 1, e.d.Usage().Mappings, "failed Maps changed the mappings: %v", e.d.Usage())
	// The granules on either side are still free.
	e.mapPage(p, g, one, 0)
	e.mapPage(p.Add(3*g), g, e.create(g, vmm.HandleNone), 0)
}

// testUnmap checks that Unmap takes exactly whole mappings: one, or a run of
// adjacent ones.
func testUnmap(t *testing.T, c Config) {
	e := open(t, c)
	g := e.gran
	p := e.reserve(4 * g)
	h2 := e.create(2*g, vmm.HandleNone)

	requireIs(t, e.d.Unmap(p, g), vmm.ErrInvalid, "Unmap of a reserved range with nothing mapped")
	requireIs(t, e.d.Unmap(p.Add(g/2), g), vmm.ErrInvalid, "Unmap at a misaligned address")
	e.mapPage(p, 2*g, h2, 0)
	requireIs(t, e.d.Unmap(p, g), vmm.ErrInvalid, "Unmap of the first half of a mapping")
	requireIs(t, e.d.Unmap(p.Add(g), g), vmm.ErrInvalid, "Unmap of the second half of a mapping")
	requireIs(t, e.d.Unmap(p, 3*g), vmm.ErrInvalid, "Unmap past the end of a mapping")
	requireIs(t, e.d.Unmap(p, g/2), vmm.ErrInvalid, "Unmap of a misaligned size")

	// A run with a gap is refused whole.
	e.mapPage(p.Add(3*g), g, e.create(g, vmm.HandleNone), 0)
	requireIs(t, e.d.Unmap(p, 4*g), vmm.ErrInvalid, "Unmap over a gap")
	require.Equal(t, 2, e.d.Usage().Mappings, "a refused Unmap changed the mappings: %v", e.d.Usage())

	// Fill the gap: four granules in three mappings go in one call.
	e.mapPage(p.Add(2*g), g, e.create(g, vmm.HandleNone), 0)
	require.NoError(t, e.d.Unmap(p, 4*g), "Unmap of a run of adjacent mappings")
	u := e.d.Usage()
	require.Zero(t, u.Mappings, "mappings left after the Unmap: %v", u)
	require.Zero(t, u.MappedBytes, "mapped bytes left after the Unmap: %v", u)
	requireIs(t, e.d.Unmap(p, 4*g), vmm.ErrInvalid, "Unmap twice")
	// The range can be mapped again.
	e.mapRW(p, 4*g, e.create(4*g, vmm.HandleNone), 0)
	e.write(p.Add(4*g-1), []byte{7})
}

// testSetAccess checks that SetAccess needs mappings under every byte and
// takes a run of mappings in one call.
func testSetAccess(t *testing.T, c Config) {
	e := open(t, c)
	g := e.gran
	rw := vmm.ReadWrite(e.dev)
	p := e.reserve(3 * g)
	requireIs(t, e.d.SetAccess(p, g, rw), vmm.ErrInvalid, "SetAccess on a range with nothing mapped")

	h1 := e.create(g, vmm.HandleNone)
	h2 := e.create(2*g, vmm.HandleNone)
	e.mapPage(p, g, h1, 0)
	requireIs(t, e.d.SetAccess(p, 2*g, rw), vmm.ErrInvalid, "SetAccess on a partly mapped range")
	requireIs(t, e.d.SetAccess(p.Add(g/2), g, rw), vmm.ErrInvalid, "SetAccess at a misaligned address")
	requireIs(t, e.d.SetAccess(p, g, nil), vmm.ErrInvalid, "SetAccess with no descriptors")
	twice := []vmm.AccessDesc{{Device: e.dev, Flags: vmm.AccessReadWrite}, {Device: e.dev, Flags: vmm.AccessRead}}
	requireIs(t, e.d.SetAccess(p, g, twice), vmm.ErrInvalid, "SetAccess that lists a device twice")
	n, err := e.d.DeviceCount()
	require.NoError(t, err)
	requireIs(t, e.d.SetAccess(p, g, vmm.ReadWrite(vmm.Device(n))), vmm.ErrInvalid, "SetAccess for a device past the last")

	// Two pages in two mappings, one call.
	e.mapPage(p.Add(g), 2*g, h2, 0)
	require.NoError(t, e.d.SetAccess(p, 3*g, rw), "SetAccess over a run of mappings")
	data := pattern(int(2*g), 3)
	e.write(p.Add(g/2), data)
	require.Equal(t, data, e.read(p.Add(g/2), len(data)), "bytes across the two mappings")
	// Setting the same access again, on one mapping of the run, is allowed.
	require.NoError(t, e.d.SetAccess(p.Add(g), 2*g, rw), "SetAccess on one mapping of a run")
	require.Equal(t, data, e.read(p.Add(g/2), len(data)), "bytes after setting the access again")
}

// testUsage checks that Usage counts what is outstanding, since the leak
// check trusts it.
func testUsage(t *testing.T, c Config) {
	e := open(t, c)
	g := e.gran
	p := e.reserve(4 * g)
	h := e.create(2*g, vmm.HandleNone)
	e.mapPage(p, 2*g, h, 0)
	e.mapPage(p.Add(2*g), g, e.create(g, vmm.HandleNone), 0)
	a := e.memAlloc(1000)
	s := e.stream()
	ev := e.event()
	want := vmm.Usage{Ranges: 1, RangeBytes: 4 * g, Handles: 2, HandleBytes: 3 * g,
		Mappings: 2, MappedBytes: 3 * g, Allocs: 1, AllocBytes: 1000, Streams: 1, Events: 1}
	require.Equal(t, want, e.d.Usage())
	require.NoError(t, e.d.EventDestroy(ev))
	require.NoError(t, e.d.StreamDestroy(s))
	require.NoError(t, e.d.MemFree(a))
	require.NoError(t, e.d.Unmap(p, 2*g))
	require.NoError(t, e.d.Release(h))
	want = vmm.Usage{Ranges: 1, RangeBytes: 4 * g, Handles: 1, HandleBytes: g, Mappings: 1, MappedBytes: g}
	require.Equal(t, want, e.d.Usage())
}
