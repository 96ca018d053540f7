package vmmtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// testReserve checks Reserve's alignment and size rules.
func testReserve(t *testing.T, c Config) {
	e := open(t, c)
	a := e.reserve(4 * e.gran)
	b := e.reserve(4 * e.gran)
	require.True(t, b.Add(4*e.gran) <= a || a.Add(4*e.gran) <= b, "ranges %v and %v overlap", a, b)

	align := 8 * e.gran
	p, err := e.d.Reserve(e.gran, align)
	require.NoError(t, err, "Reserve(%d, %d)", e.gran, align)
	require.Zero(t, uint64(p)%align, "Reserve(%d, %d) returned %v", e.gran, align, p)
	require.NoError(t, e.d.Unreserve(p, e.gran))

	_, err = e.d.Reserve(0, 0)
	requireIs(t, err, vmm.ErrInvalid, "Reserve(0, 0)")
	_, err = e.d.Reserve(e.gran+e.gran/2, 0)
	requireIs(t, err, vmm.ErrInvalid, "Reserve(%d, 0): misaligned size", e.gran+e.gran/2)
}

// testUnreserve checks that only a whole, unmapped range made by Reserve can
// be given back.
func testUnreserve(t *testing.T, c Config) {
	e := open(t, c)
	size := 4 * e.gran
	p := e.reserve(size)
	requireIs(t, e.d.Unreserve(p, size-e.gran), vmm.ErrInvalid, "Unreserve of the first part of a range")
	requireIs(t, e.d.Unreserve(p.Add(e.gran), size-e.gran), vmm.ErrInvalid, "Unreserve of the last part of a range")
	requireIs(t, e.d.Unreserve(p, size+e.gran), vmm.ErrInvalid, "Unreserve past the end of a range")

	h := e.create(e.gran, vmm.HandleNone)
	e.mapPage(p.Add(e.gran), e.gran, h, 0)
	requireIs(t, e.d.Unreserve(p, size), vmm.ErrInUse, "Unreserve with a live mapping")
	require.NoError(t, e.d.Unmap(p.Add(e.gran), e.gran))
	require.NoError(t, e.d.Unreserve(p, size), "Unreserve after the unmap")
	requireIs(t, e.d.Unreserve(p, size), vmm.ErrInvalid, "Unreserve twice")
	requireIs(t, e.d.Map(p, e.gran, h, 0), vmm.ErrInvalid, "Map into a range given back")
}

// testCreateRelease checks Create's size rules and Release's state rules.
func testCreateRelease(t *testing.T, c Config) {
	e := open(t, c)
	_, err := e.d.Create(e.dev, 0, vmm.HandleNone)
	requireIs(t, err, vmm.ErrInvalid, "Create of 0 bytes")
	_, err = e.d.Create(e.dev, e.gran/2, vmm.HandleNone)
	requireIs(t, err, vmm.ErrInvalid, "Create of half a granule")
	_, err = e.d.Create(e.dev, e.gran+e.gran/2, vmm.HandleNone)
	requireIs(t, err, vmm.ErrInvalid, "Create of 1.5 granules")

	h1 := e.create(e.gran, vmm.HandleNone)
	h2 := e.create(2*e.gran, vmm.HandleNone)
	require.NotEqual(t, h1, h2, "two live pages share a handle")

	p := e.reserve(2 * e.gran)
	e.mapPage(p, 2*e.gran, h2, 0)
	requireIs(t, e.d.Release(h2), vmm.ErrInUse, "Release of a mapped page")
	require.NoError(t, e.d.Unmap(p, 2*e.gran))
	require.NoError(t, e.d.Release(h2), "Release after the unmap")
	requireIs(t, e.d.Release(h2), vmm.ErrInvalid, "Release twice")
	require.NoError(t, e.d.Release(h1))
}

// oversize is a request the device cannot hold: its total memory and 8 GiB
// more, rounded up to the granularity.
func (e *env) oversize() uint64 {
	e.t.Helper()
	_, total, err := e.d.MemInfo(e.dev)
	require.NoError(e.t, err)
	n := total + 8<<30
	return (n + e.gran - 1) / e.gran * e.gran
}

// testCreateOutOfMemory checks that a page beyond the device's memory is
// ErrOutOfMemory and that the failure leaves nothing behind.
func testCreateOutOfMemory(t *testing.T, c Config) {
	e := open(t, c)
	size := e.oversize()
	h, err := e.d.Create(e.dev, size, vmm.HandleNone)
	if err == nil {
		e.releaseLater(h)
	}
	requireIs(t, err, vmm.ErrOutOfMemory, "Create(%d bytes) beyond the device's memory", size)
	require.True(t, e.d.Usage().Zero(), "a failed Create left %v", e.d.Usage())
	// The driver still works after the failure.
	e.create(e.gran, vmm.HandleNone)
}

// testMemInfoFollowsPages checks that free memory drops by a page's size
// when it is created and comes back when it is released. Other processes may
// move a GPU's free memory, so the check allows slack there.
func testMemInfoFollowsPages(t *testing.T, c Config) {
	e := open(t, c)
	size := (64 << 20) / e.gran * e.gran
	if size == 0 {
		size = e.gran
	}
	var slack uint64 = 32 << 20
	if e.d.Backend() == "host" {
		slack = 0
	}
	free0, total, err := e.d.MemInfo(e.dev)
	require.NoError(t, err)
	h := e.create(size, vmm.HandleNone)
	free1, total1, err := e.d.MemInfo(e.dev)
	require.NoError(t, err)
	require.Equal(t, total, total1, "total memory changed")
	require.GreaterOrEqual(t, free0+slack, free1+size, "free %d -> %d after creating %d bytes", free0, free1, size)
	if slack == 0 {
		require.Equal(t, free0-size, free1, "free memory after creating %d bytes", size)
	}
	require.NoError(t, e.d.Release(h))
	free2, _, err := e.d.MemInfo(e.dev)
	require.NoError(t, err)
	require.GreaterOrEqual(t, free2+slack, free0, "free %d -> %d after releasing", free0, free2)
	if slack == 0 {
		require.Equal(t, free0, free2, "free memory after the release")
	}
}
