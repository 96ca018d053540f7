//go:build cgo && linux

package cuda

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// TestContextRules checks that a call leaves the thread's context as it
// found it: none stays none (our goroutines), and the device's primary
// context stays current (PyTorch's threads).
func TestContextRules(t *testing.T) {
	d := openGPU(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer func() { require.NoError(t, d.setCurrentContext(-1)) }()

	for _, dev := range []vmm.Device{-1, 0} {
		require.NoError(t, d.setCurrentContext(dev))
		before, _, err := d.currentContext(0)
		require.NoError(t, err)
		cycle(t, d)
		after, primary, err := d.currentContext(0)
		require.NoError(t, err)
		require.Equal(t, before, after, "current context changed by calls (started with device %d's)", dev)
		require.Equal(t, dev == 0, primary)
	}
}

// TestMappedWithoutContext checks the VMM calls made on a thread with no
// context: the page they map is usable by the device (copies and a memset
// reach it) and the thread still has no context after them.
func TestMappedWithoutContext(t *testing.T) {
	d := openGPU(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	require.NoError(t, d.setCurrentContext(-1))
	p, h := mapPage(t, d, 0)
	now, _, err := d.currentContext(0)
	require.NoError(t, err)
	require.Zero(t, now, "reserve, create, map and set access left a context current")

	g := d.books.Granularity()
	src := make([]byte, g)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	require.NoError(t, d.CopyHtoD(p, src))
	require.NoError(t, d.Memset(p.Add(4096), 0xAB, 4096))
	got := make([]byte, g)
	require.NoError(t, d.CopyDtoH(got, p))
	for i := range 4096 {
		src[4096+i] = 0xAB
	}
	require.Equal(t, src, got, "the bytes written through the mapping made with no context")

	require.NoError(t, d.Unmap(p, g))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Unreserve(p, g))
	now, _, err = d.currentContext(0)
	require.NoError(t, err)
	require.Zero(t, now)
}

// TestContextAfterReopen checks that Close leaves no context current on
// the thread, and that a Driver opened after it works and gets the same
// primary context handle.
func TestContextAfterReopen(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	first := openGPU(t)
	require.NoError(t, first.setCurrentContext(-1))
	cycle(t, first)
	ctx := uintptr(first.devs[0].Load().ctx)
	require.NoError(t, first.Close())
	now, _, err := first.currentContext(0)
	if err == nil {
		require.Zero(t, now, "no context is current after Close")
	}

	d := openGPU(t)
	cycle(t, d)
	now, primary, err := d.currentContext(0)
	require.NoError(t, err)
	require.Zero(t, now, "no context is current after the calls")
	require.False(t, primary)
	again := uintptr(d.devs[0].Load().ctx)
	t.Logf("primary context handle before Close %#x, after re-Open %#x", ctx, again)
}

// cycle takes one page through its life on d, with a memset and a
// memory query on the way.
func cycle(t *testing.T, d *Driver) {
	t.Helper()
	_, _, err := d.MemInfo(0)
	require.NoError(t, err)
	p, h := mapPage(t, d, 0)
	require.NoError(t, d.Memset(p, 7, 4096))
	require.NoError(t, d.Unmap(p, d.books.Granularity()))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Unreserve(p, d.books.Granularity()))
}

// mapPage reserves, creates and maps one granule on dev, read-write.
func mapPage(t testing.TB, d *Driver, dev vmm.Device) (vmm.DevicePtr, vmm.Handle) {
	g := d.books.Granularity()
	p, err := d.Reserve(g, 0)
	require.NoError(t, err)
	h, err := d.Create(dev, g, vmm.HandleNone)
	require.NoError(t, err)
	require.NoError(t, d.Map(p, g, h, 0))
	require.NoError(t, d.SetAccess(p, g, vmm.ReadWrite(dev)))
	return p, h
}

// TestDeviceFacts checks what DeviceInfo reads against what the H100/H200
// class of GPU must report.
func TestDeviceFacts(t *testing.T) {
	d := openGPU(t)
	v, err := d.DriverVersion()
	require.NoError(t, err)
	require.GreaterOrEqual(t, v, 12000)
	info, err := d.DeviceInfo(0)
	require.NoError(t, err)
	t.Logf("driver %d, device 0: %s %s, %d bytes, VMM %v, posix fd %v, fabric %v, RDMA with VMM %v, granularity %d (recommended %d)",
		v, info.Name, info.UUIDString(), info.TotalMemory, info.VMM, info.PosixFD, info.Fabric, info.RDMAWithVMM,
		info.Granularity, info.RecommendedGranularity)
	require.True(t, info.VMM, "device 0 has no VMM")
	require.Equal(t, d.books.Granularity(), info.Granularity)
	free, total, err := d.MemInfo(0)
	require.NoError(t, err)
	require.LessOrEqual(t, free, total)
	require.Equal(t, info.TotalMemory, total)
}

// TestDriverErrors checks errors that come from the driver itself: the
// text is the driver's and the sentinel matches.
func TestDriverErrors(t *testing.T) {
	d := openGPU(t)
	g := d.books.Granularity()
	// An address space larger than any GPU's reservation limit.
	_, err := d.Reserve(1<<62, 0)
	require.Error(t, err)
	var r Result
	require.True(t, errors.As(err, &r), "%v", err)
	require.Contains(t, err.Error(), r.Name())
	t.Logf("Reserve(1<<62): %v", err)
	// Map a page at an address no one reserved, behind the books' back.
	h, err := d.Create(0, g, vmm.HandleNone)
	require.NoError(t, err)
	err = d.sym.memMap(0, 0x1000_0000_0000, g, 0, h)
	require.Error(t, err)
	require.True(t, errors.As(err, &r), "%v", err)
	t.Logf("cuMemMap at an unreserved address: %v", err)
	require.NoError(t, d.Release(h))
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
}

// TestImportedPage checks what ImportFD records: a new handle, the page's
// device and handle types, and the driver refusing a map past its end.
func TestImportedPage(t *testing.T) {
	d := openGPU(t)
	g := d.books.Granularity()
	h, err := d.Create(0, 2*g, vmm.HandlePosixFD)
	require.NoError(t, err)
	fd, err := d.ExportFD(h)
	require.NoError(t, err)
	imp, err := d.ImportFD(fd)
	require.NoError(t, err)
	require.NoError(t, closeFD(fd))
	require.NotEqual(t, h, imp)
	p, err := d.books.Page(imp)
	require.NoError(t, err)
	require.Equal(t, vmm.Device(0), p.Device)
	require.Equal(t, vmm.HandlePosixFD, p.Types)
	q, err := d.Reserve(4*g, 0)
	require.NoError(t, err)
	err = d.Map(q, 3*g, imp, 0)
	require.Error(t, err, "map of 3 granules of a 2-granule import")
	t.Logf("map of 3 granules of a 2-granule import: %v", err)
	require.NoError(t, d.Map(q, 2*g, imp, 0))
	require.NoError(t, d.SetAccess(q, 2*g, vmm.ReadWrite(0)))
	data := bytes.Repeat([]byte("xseg"), 1024)
	require.NoError(t, d.CopyHtoD(q.Add(g), data))
	require.NoError(t, d.Unmap(q, 2*g))
	require.NoError(t, d.Unreserve(q, 4*g))
	require.NoError(t, d.Release(imp))
	require.NoError(t, d.Release(h))
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
}

// TestEventNotReady checks that an event behind queued work reports false
// without an error, then true.
func TestEventNotReady(t *testing.T) {
	d := openGPU(t)
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	e, err := d.EventCreate(0)
	require.NoError(t, err)
	const n = 1 << 30
	p, err := d.MemAlloc(0, n)
	require.NoError(t, err)
	pending := false
	for i := 0; i < 20 && !pending; i++ {
		for k := 0; k < 8; k++ {
			require.NoError(t, d.MemsetAsync(p, byte(k), n, s))
		}
		require.NoError(t, d.EventRecord(e, s))
		done, err := d.EventQuery(e)
		require.NoError(t, err)
		pending = !done
	}
	require.True(t, pending, "8 GiB of memset never left an event pending")
	require.NoError(t, d.EventSynchronize(e))
	done, err := d.EventQuery(e)
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, d.MemFree(p))
	require.NoError(t, d.EventDestroy(e))
	require.NoError(t, d.StreamDestroy(s))
}
