package xseg_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// openTwo opens two virtual host devices, one allocator each.
func openTwo(t *testing.T) *xseg.Devices {
	t.Helper()
	d, err := host.Open(host.Options{Devices: 2, Capacity: 1 << 30})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	vmmtest.CheckLeaks(t, d)
	cfg := xseg.DefaultConfig()
	ds, err := xseg.OpenDevices(xseg.Options{Driver: d, Config: &cfg})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ds.Close()) })
	return ds
}

// mappedAccess returns dev's access to every mapped run of a's snapshot.
func mappedAccess(t *testing.T, d vmm.Driver, a xseg.Allocator, dev vmm.Device) []vmm.Access {
	t.Helper()
	var out []vmm.Access
	for _, seg := range a.Snapshot().Segments {
		for _, r := range seg.Mapped {
			got, err := d.GetAccess(r.Ptr, dev)
			require.NoError(t, err)
			out = append(out, got)
		}
	}
	return out
}

func TestDevicesPeerCopy(t *testing.T) {
	ds := openTwo(t)
	require.Equal(t, 2, ds.Count())
	require.Nil(t, ds.For(2))
	a0, a1 := ds.For(0), ds.For(1)
	src, err := a0.Alloc(8<<20, 0)
	require.NoError(t, err)
	dst, err := a1.Alloc(8<<20, 0)
	require.NoError(t, err)
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 1<<20)
	d := ds.Driver()
	require.NoError(t, d.CopyHtoD(src, data))

	require.Equal(t, []vmm.Access{vmm.AccessNone}, mappedAccess(t, d, a0, 1), "before enabling")
	require.ErrorIs(t, ds.Copy(dst, src, uint64(len(data))), vmm.ErrInvalid, "copy without peer access")
	require.NoError(t, ds.EnablePeerAccess(0, 1))
	require.Equal(t, []vmm.Access{vmm.AccessReadWrite}, mappedAccess(t, d, a0, 1), "after enabling")
	require.NoError(t, ds.Copy(dst, src, uint64(len(data))))
	got := make([]byte, len(data))
	require.NoError(t, d.CopyDtoH(got, dst))
	require.True(t, bytes.Equal(data, got), "bytes copied from device 0 to device 1")

	more, err := a0.Alloc(64<<20, 0)
	require.NoError(t, err)
	for _, acc := range mappedAccess(t, d, a0, 1) {
		require.Equal(t, vmm.AccessReadWrite, acc, "mapped after enabling")
	}
	require.NoError(t, ds.Copy(more, dst, 4096), "copy from device 1 to device 0")
	require.NoError(t, ds.DisablePeerAccess(0, 1))
	for _, acc := range mappedAccess(t, d, a0, 1) {
		require.Equal(t, vmm.AccessNone, acc, "after disabling")
	}
	require.ErrorIs(t, ds.Copy(dst, src, 4096), vmm.ErrInvalid, "copy after disabling")

	require.ErrorIs(t, ds.EnablePeerAccess(0, 2), vmm.ErrInvalid)
	require.ErrorIs(t, ds.EnablePeerAccess(5, 1), vmm.ErrInvalid)
	require.ErrorIs(t, ds.EnablePeerAccess(1, 1), vmm.ErrInvalid)
	for _, b := range []struct {
		a xseg.Allocator
		p vmm.DevicePtr
	}{{a0, src}, {a0, more}, {a1, dst}} {
		require.NoError(t, b.a.Free(b.p))
	}
}

func TestDevicesFallbackHasNoPeerAccess(t *testing.T) {
	d, err := host.Open(host.Options{Devices: 2, Capacity: 1 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	cfg := xseg.DefaultConfig()
	ds, err := xseg.OpenDevices(xseg.Options{Driver: d, Config: &cfg, Allocator: "fallback"})
	if err != nil {
		require.ErrorIs(t, err, vmm.ErrNotSupported, "the fallback allocator is missing from this tree")
		t.Skipf("no fallback allocator: %v", err)
	}
	defer func() { require.NoError(t, ds.Close()) }()
	err = ds.EnablePeerAccess(0, 1)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.ErrorContains(t, err, "cannot grant it")
}

func TestOpenDevicesOwnsDriver(t *testing.T) {
	cfg := xseg.DefaultConfig()
	ds, err := xseg.OpenDevices(xseg.Options{Backend: "host", HostCapacity: 1 << 30, Config: &cfg})
	require.NoError(t, err)
	require.Equal(t, 1, ds.Count())
	d := ds.Driver()
	p, err := ds.For(0).Alloc(1, 0)
	require.NoError(t, err)
	require.NotZero(t, p)
	require.NoError(t, ds.Close())
	_, err = d.DeviceCount()
	require.ErrorIs(t, err, vmm.ErrClosed, "Close closes the driver OpenDevices opened")
	require.NoError(t, ds.Close(), "a second Close")
}

// TestDevicesCloseRetries: when an allocator fails to give its memory
// back to a driver the caller owns, Close says so and the next Close
// tries again, until nothing is held; peer access after Close fails with
// vmm.ErrClosed.
func TestDevicesCloseRetries(t *testing.T) {
	hd, err := host.Open(host.Options{Devices: 2, Capacity: 1 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, hd.Close()) }()
	f := vmmtest.NewFaulty(hd)
	cfg := xseg.DefaultConfig()
	ds, err := xseg.OpenDevices(xseg.Options{Driver: f, Config: &cfg})
	require.NoError(t, err)
	for dev := range vmm.Device(2) {
		_, err := ds.For(dev).Alloc(1<<20, 0)
		require.NoError(t, err)
	}
	f.FailNth(vmmtest.OpUnreserve, 1, nil)
	err = ds.Close()
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.ErrorContains(t, err, "device 0")
	require.False(t, hd.Usage().Zero(), "the range the driver kept is still held")
	require.Nil(t, ds.For(0))
	require.ErrorIs(t, ds.EnablePeerAccess(0, 1), vmm.ErrClosed)
	require.NoError(t, ds.Close(), "the second Close gives back what the first kept")
	require.True(t, hd.Usage().Zero(), "%v", hd.Usage())
	require.NoError(t, ds.Close())
}
