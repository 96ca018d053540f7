package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// TestToucher: the device chosen for work is one every span allows; spans
// in plain allocations or empty need none; an unmapped address and spans
// no single device may touch are refused.
func TestToucher(t *testing.T) {
	l := books(t)                          // page 2 (device 1) mapped at granule 2, no access yet
	_, err := l.BeginMap(at(4), 2*G, 3, 0) // page 3, device 0
	require.NoError(t, err)
	rw := func(p vmm.DevicePtr) ledger.Span { return ledger.Span{Ptr: p, N: G, Want: vmm.AccessReadWrite} }
	ro := func(p vmm.DevicePtr) ledger.Span { return ledger.Span{Ptr: p, N: G, Want: vmm.AccessRead} }

	_, _, err = l.Toucher("copy", rw(at(2)))
	require.ErrorIs(t, err, vmm.ErrInvalid, "mapped but not accessible")
	_, _, err = l.Toucher("copy", rw(at(7)))
	require.ErrorIs(t, err, vmm.ErrInvalid, "not mapped")
	require.ErrorContains(t, err, "neither mapped nor allocated")

	_, err = l.GrantAccess(at(2), 2*G, vmm.ReadWrite(1))
	require.NoError(t, err)
	_, err = l.GrantAccess(at(4), 2*G, vmm.ReadWrite(0))
	require.NoError(t, err)
	dev, found, err := l.Toucher("copy", rw(at(2)))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, vmm.Device(1), dev)
	_, _, err = l.Toucher("copy", rw(at(2)), ro(at(4)))
	require.ErrorIs(t, err, vmm.ErrInvalid, "no device may touch both")

	_, err = l.GrantAccess(at(4), 2*G, []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessReadWrite}, {Device: 1, Flags: vmm.AccessRead}})
	require.NoError(t, err)
	dev, found, err = l.Toucher("copy", rw(at(2)), ro(at(4)))
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, vmm.Device(1), dev, "device 1 may write granule 2 and read granule 4")
	require.ErrorIs(t, l.May(0, rw(at(2))), vmm.ErrInvalid)
	require.NoError(t, l.May(1, rw(at(2)), ro(at(4))))

	l.AddAlloc(at(100), 3*G)
	in := ledger.Span{Ptr: at(100).Add(10), N: G, Want: vmm.AccessReadWrite}
	require.True(t, l.InAlloc(in))
	require.False(t, l.InAlloc(ledger.Span{Ptr: at(102), N: 2 * G}), "runs past the allocation")
	_, found, err = l.Toucher("memset", in, ledger.Span{Ptr: at(7), N: 0})
	require.NoError(t, err)
	require.False(t, found, "plain allocations and empty spans need no device")
}

// TestWrapAround: a span whose end runs past the top of the address space
// is refused, in a mapping and in a plain allocation; its end wraps to a
// low address, below every end it is compared with.
func TestWrapAround(t *testing.T) {
	l := books(t) // page 2 (device 1) mapped at granule 2
	_, err := l.GrantAccess(at(2), 2*G, vmm.ReadWrite(1))
	require.NoError(t, err)
	l.AddAlloc(at(100), G)
	const n = ^uint64(0)
	for _, p := range []vmm.DevicePtr{at(2), at(100).Add(1)} {
		s := ledger.Span{Ptr: p, N: n, Want: vmm.AccessReadWrite}
		require.False(t, l.InAlloc(s), "span at %v", p)
		require.ErrorIs(t, l.May(1, s), vmm.ErrInvalid, "span at %v", p)
		_, _, err := l.Toucher("memset", s)
		require.ErrorIs(t, err, vmm.ErrInvalid, "span at %v", p)
		require.ErrorContains(t, err, "wraps around")
	}
	require.ErrorIs(t, l.Accessible(at(2), n, 1, vmm.AccessRead), vmm.ErrInvalid)
}
