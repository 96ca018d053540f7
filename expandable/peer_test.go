package expandable

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// twoDevices opens a host driver with two virtual devices of 1 GiB behind
// a Faulty (to count and fail calls), checked for leaks at the test's end.
func twoDevices(t *testing.T) *vmmtest.Faulty {
	t.Helper()
	d, err := host.Open(host.Options{Devices: 2, Capacity: 1 << 30})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	vmmtest.CheckLeaks(t, d)
	return vmmtest.NewFaulty(d)
}

// newAllocOn makes an allocator of device dev that the test closes.
func newAllocOn(t *testing.T, d vmm.Driver, dev vmm.Device) *Allocator {
	t.Helper()
	a, err := New(d, dev, ClassicConfig(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

// requireRuns checks dev's access to every mapped run of a's snapshot (its
// first and last byte) and returns how many runs there are.
func requireRuns(t *testing.T, a *Allocator, dev vmm.Device, want vmm.Access, what string) int {
	t.Helper()
	n := 0
	for _, seg := range a.Snapshot().Segments {
		for _, r := range seg.Mapped {
			for _, at := range []vmm.DevicePtr{r.Ptr, r.Ptr.Add(r.Size - 1)} {
				got, err := a.Driver().GetAccess(at, dev)
				require.NoError(t, err, "GetAccess(%v, %d): %s", at, dev, what)
				require.Equal(t, want, got, "device %d at %v (run %v+%d): %s", dev, at, r.Ptr, r.Size, what)
			}
			n++
		}
	}
	return n
}

// stream makes a stream on dev that the test destroys at its end.
func stream(t *testing.T, d vmm.Driver, dev vmm.Device) vmm.Stream {
	t.Helper()
	s, err := d.StreamCreate(dev)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.StreamDestroy(s)) })
	return s
}

func mustAlloc(t *testing.T, a *Allocator, size uint64, s vmm.Stream) vmm.DevicePtr {
	t.Helper()
	p, err := a.Alloc(size, s)
	require.NoError(t, err, "Alloc(%d) on device %d", size, a.Device())
	return p
}

func TestPeerAccessBeforeAndAfter(t *testing.T) {
	f := twoDevices(t)
	s := stream(t, f, 0) // destroyed after the allocators close
	a0, a1 := newAllocOn(t, f, 0), newAllocOn(t, f, 1)
	small := mustAlloc(t, a0, 4096, 0)
	large := mustAlloc(t, a0, 5<<20, 0)
	dst := mustAlloc(t, a1, 5<<20, 0)
	require.Equal(t, 2, requireRuns(t, a0, 1, vmm.AccessNone, "before enabling"))
	data := bytes.Repeat([]byte("peer"), 1<<20)
	require.NoError(t, f.CopyHtoD(large, data))
	require.ErrorIs(t, f.CopyDtoD(dst, large, uint64(len(data))), vmm.ErrInvalid, "a copy between the devices without peer access")

	require.NoError(t, a0.EnablePeerAccess(1))
	requireRuns(t, a0, 1, vmm.AccessReadWrite, "mapped before enabling")
	requireRuns(t, a0, 0, vmm.AccessReadWrite, "the owner, after enabling")
	calls := f.Calls(vmmtest.OpSetAccess)
	require.NoError(t, a0.EnablePeerAccess(1), "enabling twice")
	require.Equal(t, calls, f.Calls(vmmtest.OpSetAccess), "enabling twice made driver calls")
	require.Equal(t, []vmm.Device{1}, a0.Peers())

	later := mustAlloc(t, a0, 30<<20, 0) // new pages in the large segment
	side := mustAlloc(t, a0, 1<<20, s)   // a new segment, of another stream
	require.Equal(t, 3, len(a0.Snapshot().Segments), "segments")
	requireRuns(t, a0, 1, vmm.AccessReadWrite, "mapped after enabling")
	requireRuns(t, a1, 0, vmm.AccessNone, "device 1's memory stays its own")

	require.NoError(t, f.CopyDtoD(dst, large, uint64(len(data))), "a copy from device 0's block to device 1's")
	got := make([]byte, len(data))
	require.NoError(t, f.CopyDtoH(got, dst))
	require.True(t, bytes.Equal(data, got), "bytes copied between the devices")
	require.NoError(t, f.Memset(dst, 0x5a, 4096))
	require.NoError(t, f.CopyDtoD(later.Add(1<<20), dst, 4096), "a copy from device 1's block to device 0's")
	back := make([]byte, 4096)
	require.NoError(t, f.CopyDtoH(back, later.Add(1<<20)))
	require.Equal(t, bytes.Repeat([]byte{0x5a}, 4096), back)

	require.NoError(t, a0.DisablePeerAccess(1))
	requireRuns(t, a0, 1, vmm.AccessNone, "after disabling")
	requireRuns(t, a0, 0, vmm.AccessReadWrite, "the owner, after disabling")
	require.NoError(t, a0.DisablePeerAccess(1), "disabling twice")
	require.Empty(t, a0.Peers())
	afterOff := mustAlloc(t, a0, 100<<20, 0)
	requireRuns(t, a0, 1, vmm.AccessNone, "mapped after disabling")
	require.ErrorIs(t, f.CopyDtoD(dst, afterOff, 4096), vmm.ErrInvalid, "a copy after disabling")
	require.ErrorIs(t, f.CopyDtoD(dst, large, 4096), vmm.ErrInvalid, "a copy from a block mapped while enabled, after disabling")
	for _, p := range []vmm.DevicePtr{small, large, later, side, afterOff} {
		require.NoError(t, a0.Free(p))
	}
	require.NoError(t, a1.Free(dst))
}

func TestPeerAccessErrors(t *testing.T) {
	f := twoDevices(t)
	s := stream(t, f, 0)
	a0 := newAllocOn(t, f, 0)
	err := a0.EnablePeerAccess(0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "device 0 is the allocator's own")
	err = a0.EnablePeerAccess(2)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "device 2")
	require.ErrorIs(t, a0.DisablePeerAccess(-1), vmm.ErrInvalid)

	// Two runs (small and large pool); the second grant fails: the first is
	// revoked and the peer is not enabled.
	p := mustAlloc(t, a0, 4096, 0)
	q := mustAlloc(t, a0, 5<<20, 0)
	f.FailNth(vmmtest.OpSetAccess, 2, nil)
	err = a0.EnablePeerAccess(1)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.ErrorContains(t, err, "device 1")
	require.Empty(t, a0.Peers())
	requireRuns(t, a0, 1, vmm.AccessNone, "after a failed enable")
	r := mustAlloc(t, a0, 1<<20, s)
	requireRuns(t, a0, 1, vmm.AccessNone, "mapped after a failed enable")
	require.NoError(t, a0.EnablePeerAccess(1), "enabling again")
	requireRuns(t, a0, 1, vmm.AccessReadWrite, "after enabling again")
	for _, b := range []vmm.DevicePtr{p, q, r} {
		require.NoError(t, a0.Free(b))
	}
}

// TestPeerAccessImported registers a mapping made outside the allocator,
// as an importer would: peers enabled before and after reach it.
func TestPeerAccessImported(t *testing.T) {
	f := twoDevices(t)
	a0 := newAllocOn(t, f, 0)
	g := uint64(2 << 20)
	mapOne := func() vmm.DevicePtr {
		ptr, err := f.Reserve(g, 0)
		require.NoError(t, err)
		h, err := f.Create(0, g, vmm.HandleNone)
		require.NoError(t, err)
		require.NoError(t, f.Map(ptr, g, h, 0))
		require.NoError(t, f.SetAccess(ptr, g, a0.AccessList()))
		t.Cleanup(func() {
			require.NoError(t, a0.RemoveImported(ptr))
			require.NoError(t, f.Unmap(ptr, g))
			require.NoError(t, f.Release(h))
			require.NoError(t, f.Unreserve(ptr, g))
		})
		return ptr
	}
	before := mapOne()
	require.NoError(t, a0.AddImported(before, g))
	require.ErrorIs(t, a0.AddImported(before, g), vmm.ErrInvalid, "registering twice")
	require.NoError(t, a0.EnablePeerAccess(1))
	requireAccess(t, f, before, 1, vmm.AccessReadWrite)
	require.Equal(t, []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessReadWrite}, {Device: 1, Flags: vmm.AccessReadWrite}}, a0.AccessList())
	after := mapOne()
	requireAccess(t, f, after, 1, vmm.AccessReadWrite)
	require.NoError(t, a0.AddImported(after, g))
	require.NoError(t, a0.DisablePeerAccess(1))
	requireAccess(t, f, before, 1, vmm.AccessNone)
	requireAccess(t, f, after, 1, vmm.AccessNone)
	requireAccess(t, f, after, 0, vmm.AccessReadWrite)
	require.ErrorIs(t, a0.RemoveImported(12345), vmm.ErrInvalid)
}

func requireAccess(t *testing.T, d vmm.Driver, ptr vmm.DevicePtr, dev vmm.Device, want vmm.Access) {
	t.Helper()
	got, err := d.GetAccess(ptr, dev)
	require.NoError(t, err)
	require.Equal(t, want, got, "device %d at %v", dev, ptr)
}

// TestPeerAccessAfterClose: once the allocator is closed (its driver still
// open), enabling or disabling a peer fails with vmm.ErrClosed, as every
// other method does, and touches no access and no peer list.
func TestPeerAccessAfterClose(t *testing.T) {
	f := twoDevices(t)
	a, err := New(f, 0, ClassicConfig(), nil)
	require.NoError(t, err)
	p, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.EnablePeerAccess(1))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Close())

	before := f.Calls(vmmtest.OpSetAccess)
	require.ErrorIs(t, a.EnablePeerAccess(1), vmm.ErrClosed, "enabling an enabled peer")
	require.ErrorIs(t, a.DisablePeerAccess(1), vmm.ErrClosed)
	require.Equal(t, []vmm.Device{1}, a.Peers(), "a failed Disable changes no peer")
	require.ErrorIs(t, a.EnablePeerAccess(1), vmm.ErrClosed, "enabling a disabled peer")
	require.ErrorIs(t, a.DisablePeerAccess(0), vmm.ErrClosed, "the closed allocator's own device")
	require.Equal(t, before, f.Calls(vmmtest.OpSetAccess), "SetAccess calls after Close")
}
