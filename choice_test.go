package xseg_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// noVMM is a driver whose devices report no virtual memory management, as
// older drivers and some virtualised GPUs do; everything else is the
// wrapped driver's.
type noVMM struct{ vmm.Driver }

// MemsetAsync keeps the wrapped driver's queued memsets (the conformance
// suite's stream tests use them).
func (n noVMM) MemsetAsync(dst vmm.DevicePtr, value byte, size uint64, s vmm.Stream) error {
	return vmmtest.MemsetAsync(n.Driver, dst, value, size, s)
}

// DeviceInfo reports the wrapped device with VMM off.
func (n noVMM) DeviceInfo(dev vmm.Device) (vmm.DeviceInfo, error) {
	info, err := n.Driver.DeviceInfo(dev)
	info.VMM = false
	return info, err
}

func hostForChoice(t *testing.T) *host.Driver {
	d, err := host.Open(host.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	vmmtest.CheckLeaks(t, d)
	return d
}

func TestChooseAllocator(t *testing.T) {
	withVMM := hostForChoice(t)
	without := noVMM{withVMM}
	for _, c := range []struct {
		d          vmm.Driver
		name, want xseg.AllocatorKind
		reason     string
	}{
		{withVMM, "", "expandable", "auto: device 0 (xseg host device 0) of the host backend supports virtual memory management"},
		{withVMM, "auto", "expandable", "auto: "},
		{without, "auto", "fallback", "has no virtual memory management"},
		{without, "", "fallback", "auto: "},
		{withVMM, "fallback", "fallback", "asked for"},
		{without, "fallback", "fallback", "asked for"},
		{withVMM, "expandable", "expandable", "asked for"},
	} {
		got, err := xseg.ChooseAllocator(c.d, 0, c.name)
		require.NoError(t, err, "%q", c.name)
		require.Equal(t, c.want, got.Allocator, "%q (VMM %T)", c.name, c.d)
		require.Contains(t, got.Reason, c.reason)
	}
	_, err := xseg.ChooseAllocator(without, 0, "expandable")
	require.ErrorIs(t, err, vmm.ErrNotSupported, "forcing expandable without VMM")
	require.ErrorContains(t, err, "has no virtual memory management")
	_, err = xseg.ChooseAllocator(withVMM, 0, "slab")
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = xseg.ChooseAllocator(withVMM, 3, "auto")
	require.Error(t, err, "no device 3")
}

// TestOpenChoosesFallbackWithoutVMM: Open on a device without VMM makes
// the fallback allocator, which uses plain allocations only.
func TestOpenChoosesFallbackWithoutVMM(t *testing.T) {
	f := vmmtest.NewFaulty(hostForChoice(t))
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Driver: noVMM{f}, Config: &cfg})
	require.NoError(t, err)
	require.Equal(t, xseg.AllocatorFallback, a.Kind())
	p, err := a.Alloc(3<<20, 0)
	require.NoError(t, err)
	require.Equal(t, 1, f.Usage().Allocs, "one plain allocation")
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.Close())
	for _, op := range []vmmtest.Op{vmmtest.OpReserve, vmmtest.OpCreate, vmmtest.OpMap, vmmtest.OpSetAccess} {
		require.Zero(t, f.Calls(op), "a device without VMM got a %s call", op)
	}
	require.Equal(t, 1, f.Calls(vmmtest.OpMemAlloc))
	require.Equal(t, 1, f.Calls(vmmtest.OpMemFree))

	_, err = xseg.Open(xseg.Options{Driver: noVMM{f}, Allocator: "expandable", Config: &cfg})
	require.ErrorIs(t, err, vmm.ErrNotSupported)
}

// TestOpenForcesEachPair: options force either allocator on the host
// backend, and auto picks expandable there.
func TestOpenForcesEachPair(t *testing.T) {
	for _, c := range []struct{ allocator, want xseg.AllocatorKind }{
		{"", "expandable"},
		{"auto", "expandable"},
		{"expandable", "expandable"},
		{"fallback", "fallback"},
	} {
		a, err := xseg.Open(xseg.Options{Backend: "host", Allocator: c.allocator, HostCapacity: 1 << 30})
		require.NoError(t, err, "%q", c.allocator)
		require.Equal(t, c.want, xseg.Kind(a), "%q", c.allocator)
		p, err := a.Alloc(1<<20, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		require.NoError(t, a.Close())
	}
	d := hostForChoice(t)
	cfg := xseg.DefaultConfig()
	for _, c := range []struct {
		allocator, kind xseg.AllocatorKind
		plain           xseg.Allocator
	}{
		{"", "expandable", &expandable.Allocator{}},
		{"fallback", "fallback", &fallback.Allocator{}},
	} {
		a, err := xseg.Open(xseg.Options{Driver: d, Allocator: c.allocator, Config: &cfg})
		require.NoError(t, err)
		require.Equal(t, c.kind, a.Kind(), "%q", c.allocator)
		require.Equal(t, c.kind, xseg.Kind(a), "%q", c.allocator)
		require.Equal(t, c.kind, xseg.Kind(c.plain), "Kind of the allocator itself")
		require.NoError(t, a.Close())
	}
}
