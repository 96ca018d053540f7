package vmmtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// testGetAccess checks that GetAccess reports, for any address inside a
// mapping, what SetAccess granted a device, and refuses what is not mapped.
func testGetAccess(t *testing.T, c Config) {
	e := open(t, c)
	g := e.gran
	p := e.reserve(3 * g)
	h := e.create(2*g, vmm.HandleNone)
	e.mapPage(p, 2*g, h, 0)
	got, err := e.d.GetAccess(p, e.dev)
	require.NoError(t, err, "GetAccess of a mapping before SetAccess")
	require.Equal(t, vmm.AccessNone, got, "access before SetAccess")
	require.NoError(t, e.d.SetAccess(p, 2*g, vmm.ReadWrite(e.dev)))
	for _, at := range []vmm.DevicePtr{p, p.Add(g + 12345), p.Add(2*g - 1)} {
		got, err := e.d.GetAccess(at, e.dev)
		require.NoError(t, err, "GetAccess(%v)", at)
		require.Equal(t, vmm.AccessReadWrite, got, "access at %v after SetAccess", at)
	}
	_, err = e.d.GetAccess(p.Add(2*g), e.dev)
	requireIs(t, err, vmm.ErrInvalid, "GetAccess of the reserved, unmapped granule after the mapping")
	n, err := e.d.DeviceCount()
	require.NoError(t, err)
	_, err = e.d.GetAccess(p, vmm.Device(n))
	requireIs(t, err, vmm.ErrInvalid, "GetAccess for a device past the last")
	require.NoError(t, e.d.Unmap(p, 2*g))
	_, err = e.d.GetAccess(p, e.dev)
	requireIs(t, err, vmm.ErrInvalid, "GetAccess after Unmap")
}

// peer returns a device other than the one under test, skipping the test
// when the driver has only one.
func (e *env) peer() vmm.Device {
	e.t.Helper()
	n, err := e.d.DeviceCount()
	require.NoError(e.t, err)
	if n < 2 {
		e.t.Skipf("peer access needs two devices; the driver has %d", n)
	}
	if e.dev == 0 {
		return 1
	}
	return 0
}

// testPeerAccess checks access granted per device: a second device's
// access is recorded beside the owner's, copies between the two devices'
// memory and a memset from the peer's stream need it, and AccessNone
// revokes it.
func testPeerAccess(t *testing.T, c Config) {
	e := open(t, c)
	peer := e.peer()
	g := e.gran
	own, _ := e.backed(1)
	q := e.reserve(g)
	hq, err := e.d.Create(peer, g, vmm.HandleNone)
	require.NoError(t, err, "Create on the peer device %d", peer)
	e.releaseLater(hq)
	e.mapPage(q, g, hq, 0)
	require.NoError(t, e.d.SetAccess(q, g, vmm.ReadWrite(peer)), "SetAccess of the peer's page for the peer")
	e.requireAccess(own, peer, vmm.AccessNone, "the peer, before peer access")

	data := pattern(int(g), 9)
	e.write(own, data)
	requireIs(t, e.d.CopyDtoD(q, own, g), vmm.ErrInvalid, "CopyDtoD to the peer's page without peer access")
	s, err := e.d.StreamCreate(peer)
	require.NoError(t, err, "StreamCreate(%d)", peer)
	defer func() { require.NoError(t, e.d.StreamDestroy(s)) }()
	requireIs(t, MemsetAsync(e.d, own.Add(10), 0xab, 5, s), vmm.ErrInvalid, "a memset from the peer's stream without peer access")

	require.NoError(t, e.d.SetAccess(own, g, vmm.ReadWrite(peer)), "granting the peer access")
	e.requireAccess(own, e.dev, vmm.AccessReadWrite, "the owner, after peer access")
	e.requireAccess(own, peer, vmm.AccessReadWrite, "the peer, after peer access")
	require.NoError(t, e.d.CopyDtoD(q, own, g), "CopyDtoD to the peer's page with peer access")
	require.NoError(t, MemsetAsync(e.d, own.Add(10), 0xab, 5, s), "a memset from the peer's stream with peer access")
	require.NoError(t, e.d.StreamSynchronize(s))
	require.NoError(t, e.d.CopyDtoD(own.Add(g/2), q, 100), "CopyDtoD from the peer's page back")
	got := e.read(own, int(g))
	require.Equal(t, []byte{0xab, 0xab, 0xab, 0xab, 0xab}, got[10:15], "bytes the peer's stream set")
	require.Equal(t, data[:100], got[g/2:g/2+100], "bytes copied to the peer and back")

	require.NoError(t, e.d.SetAccess(own, g, []vmm.AccessDesc{{Device: peer, Flags: vmm.AccessNone}}), "revoking the peer's access")
	e.requireAccess(own, peer, vmm.AccessNone, "the peer, after revoking")
	e.requireAccess(own, e.dev, vmm.AccessReadWrite, "the owner, after revoking the peer")
	requireIs(t, e.d.CopyDtoD(q, own, g), vmm.ErrInvalid, "CopyDtoD to the peer's page after revoking")
}

// requireAccess fails the test unless dev's access at ptr is want.
func (e *env) requireAccess(ptr vmm.DevicePtr, dev vmm.Device, want vmm.Access, what string) {
	e.t.Helper()
	got, err := e.d.GetAccess(ptr, dev)
	require.NoError(e.t, err, "GetAccess(%v, %d): %s", ptr, dev, what)
	require.Equal(e.t, want, got, "GetAccess(%v, %d): %s", ptr, dev, what)
}
