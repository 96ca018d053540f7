package xseg_test

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/cuda"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// openTwoGPUs opens the CUDA driver and one allocator per GPU. It skips
// without a driver (fails under XSEG_REQUIRE_GPU=1) and with fewer than two
// GPUs (fails under XSEG_REQUIRE_PEERS=1).
func openTwoGPUs(t *testing.T) *xseg.Devices {
	t.Helper()
	d, err := cuda.Open()
	if err != nil {
		if errors.Is(err, vmm.ErrNotSupported) && os.Getenv("XSEG_REQUIRE_GPU") != "1" {
			t.Skipf("no CUDA driver or device: %v", err)
		}
		t.Fatalf("opening CUDA (XSEG_REQUIRE_GPU=%q): %v", os.Getenv("XSEG_REQUIRE_GPU"), err)
	}
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	n, err := d.DeviceCount()
	require.NoError(t, err)
	if n < 2 {
		if os.Getenv("XSEG_REQUIRE_PEERS") == "1" {
			t.Fatalf("XSEG_REQUIRE_PEERS=1, but the driver has %d GPU", n)
		}
		t.Skipf("peer access needs two GPUs; the driver has %d", n)
	}
	cfg := xseg.DefaultConfig()
	ds, err := xseg.OpenDevices(xseg.Options{Driver: d, Config: &cfg})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ds.Close()) })
	return ds
}

// TestPeerAccessGPU: GPU 1 reads and writes xseg memory of GPU 0 (a
// memset queued on a GPU 1 stream, copies run in GPU 1's context) once
// peer access is enabled, and is refused before it and after disabling.
// cuMemGetAccess reports what the driver granted.
func TestPeerAccessGPU(t *testing.T) {
	ds := openTwoGPUs(t)
	d := ds.Driver()
	const size = 256 << 20
	src, err := ds.For(0).Alloc(size, 0)
	require.NoError(t, err)
	back, err := ds.For(0).Alloc(size, 0)
	require.NoError(t, err)
	dst, err := ds.For(1).Alloc(size, 0)
	require.NoError(t, err)
	s1, err := d.StreamCreate(1)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(s1)) }()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	require.NoError(t, d.CopyHtoD(src, data))

	requireGPUAccess(t, d, src, 1, vmm.AccessNone, "before enabling")
	require.ErrorIs(t, ds.Copy(dst, src, size), vmm.ErrInvalid, "GPU 1 reading GPU 0's memory without peer access")
	require.ErrorIs(t, vmmtest.MemsetAsync(d, src, 0xab, 4096, s1), vmm.ErrInvalid, "a GPU 1 stream writing GPU 0's memory without peer access")

	require.NoError(t, ds.EnablePeerAccess(0, 1))
	requireGPUAccess(t, d, src, 1, vmm.AccessReadWrite, "after enabling")
	requireGPUAccess(t, d, src.Add(size-1), 1, vmm.AccessReadWrite, "after enabling, last byte")
	requireGPUAccess(t, d, src, 0, vmm.AccessReadWrite, "the owner")
	requireGPUAccess(t, d, dst, 0, vmm.AccessNone, "GPU 1's memory for GPU 0 (one-way)")

	start := time.Now()
	require.NoError(t, ds.Copy(dst, src, size), "GPU 1 reading GPU 0's memory")
	el := time.Since(start)
	t.Logf("GPU 0 -> GPU 1, %d MiB in GPU 1's context: %v (%.1f GB/s)", size>>20, el, float64(size)/el.Seconds()/1e9)
	got := make([]byte, size)
	require.NoError(t, d.CopyDtoH(got, dst))
	require.True(t, bytes.Equal(data, got), "bytes GPU 1 read from GPU 0")

	require.NoError(t, vmmtest.MemsetAsync(d, dst, 0x3c, 1<<20, s1))
	require.NoError(t, d.StreamSynchronize(s1))
	start = time.Now()
	require.NoError(t, ds.Copy(back, dst, size), "GPU 1 writing GPU 0's memory")
	el = time.Since(start)
	t.Logf("GPU 1 -> GPU 0, %d MiB in GPU 1's context: %v (%.1f GB/s)", size>>20, el, float64(size)/el.Seconds()/1e9)
	require.NoError(t, d.CopyDtoH(got[:2<<20], back))
	require.Equal(t, bytes.Repeat([]byte{0x3c}, 1<<20), got[:1<<20], "bytes GPU 1 wrote into GPU 0's memory")
	require.Equal(t, data[1<<20:2<<20], got[1<<20:2<<20], "bytes GPU 1 wrote into GPU 0's memory")

	require.NoError(t, vmmtest.MemsetAsync(d, src.Add(100), 0xab, 4096, s1), "a GPU 1 stream writing GPU 0's memory")
	require.NoError(t, d.StreamSynchronize(s1))
	require.NoError(t, d.CopyDtoH(got[:8192], src))
	require.Equal(t, bytes.Repeat([]byte{0xab}, 4096), got[100:4196], "bytes the GPU 1 stream set")
	require.Equal(t, data[:100], got[:100], "bytes before the memset")

	later, err := ds.For(0).Alloc(64<<20, 0)
	require.NoError(t, err)
	requireGPUAccess(t, d, later, 1, vmm.AccessReadWrite, "mapped after enabling")
	require.NoError(t, ds.DisablePeerAccess(0, 1))
	requireGPUAccess(t, d, src, 1, vmm.AccessNone, "after disabling")
	requireGPUAccess(t, d, later, 1, vmm.AccessNone, "after disabling")
	require.ErrorIs(t, ds.Copy(dst, src, size), vmm.ErrInvalid, "after disabling")
	for _, p := range []vmm.DevicePtr{src, back, later} {
		require.NoError(t, ds.For(0).Free(p))
	}
	require.NoError(t, ds.For(1).Free(dst))
}

func requireGPUAccess(t *testing.T, d vmm.Driver, ptr vmm.DevicePtr, dev vmm.Device, want vmm.Access, what string) {
	t.Helper()
	got, err := d.GetAccess(ptr, dev)
	require.NoError(t, err, "cuMemGetAccess(%v, device %d): %s", ptr, dev, what)
	require.Equal(t, want, got, "device %d's access at %v: %s", dev, ptr, what)
}
