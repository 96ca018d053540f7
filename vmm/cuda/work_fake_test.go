package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// TestStreamsAndEvents checks the contexts that stream and event calls run
// in, the undo of a failed destroy, the refusal of a destroyed stream and
// of a stream of another device, and an event that is not yet complete.
func TestStreamsAndEvents(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	s, err := d.StreamCreate(1)
	require.NoError(t, err)
	c, _ := f.lastCtx("streamCreate")
	require.Equal(t, ctxOf(1), c)
	e, err := d.EventCreate(1)
	require.NoError(t, err)
	e0, err := d.EventCreate(0)
	require.NoError(t, err)

	require.NoError(t, d.StreamSynchronize(s))
	c, _ = f.lastCtx("streamSynchronize")
	require.Equal(t, ctxOf(1), c, "a stream made here is synchronised in its device's context")
	require.NoError(t, d.StreamSynchronize(0))
	c, _ = f.lastCtx("streamSynchronize")
	require.Zero(t, c, "stream 0 is synchronised in any context")
	// A stream made elsewhere goes to the driver as is, in any context.
	err = d.StreamSynchronize(0x5eed)
	requireResult(t, err, ErrorInvalidHandle, "cuStreamSynchronize 0x5eed")

	require.NoError(t, d.EventRecord(e, s))
	c, _ = f.lastCtx("eventRecord")
	require.Equal(t, ctxOf(1), c)
	err = d.EventRecord(e0, s)
	require.ErrorIs(t, err, vmm.ErrInvalid, "an event of device 0 recorded on a stream of device 1")
	require.Contains(t, err.Error(), "of device 1")
	require.NoError(t, d.EventRecord(e0, 0))
	_, err = d.EventQuery(0x5eed)
	require.ErrorIs(t, err, vmm.ErrInvalid, "an event not made here")

	f.notReady(e, 2)
	for range 2 {
		done, err := d.EventQuery(e)
		require.NoError(t, err)
		require.False(t, done)
	}
	done, err := d.EventQuery(e)
	require.NoError(t, err)
	require.True(t, done)
	f.failNext("eventQuery", ErrorIllegalAddress)
	_, err = d.EventQuery(e)
	requireResult(t, err, ErrorIllegalAddress, "cuEventQuery")
	f.failNext("eventSynchronize", ErrorUnknown)
	requireResult(t, d.EventSynchronize(e), ErrorUnknown, "cuEventSynchronize")
	require.NoError(t, d.EventSynchronize(e))
	f.failNext("eventRecord", ErrorUnknown)
	requireResult(t, d.EventRecord(e, s), ErrorUnknown, "cuEventRecord")

	f.failNext("eventDestroy", ErrorUnknown)
	requireResult(t, d.EventDestroy(e), ErrorUnknown, "cuEventDestroy")
	require.Equal(t, 2, d.Usage().Events, "a failed destroy forgot the event")
	require.NoError(t, d.EventDestroy(e))
	require.NoError(t, d.EventDestroy(e0))
	require.ErrorIs(t, d.EventDestroy(e0), vmm.ErrInvalid)

	f.failNext("streamDestroy", ErrorUnknown)
	requireResult(t, d.StreamDestroy(s), ErrorUnknown, "cuStreamDestroy")
	require.Equal(t, 1, d.Usage().Streams)
	require.NoError(t, d.StreamSynchronize(s), "a stream whose destroy failed lives on")
	require.NoError(t, d.StreamDestroy(s))
	c, _ = f.lastCtx("streamDestroy")
	require.Equal(t, ctxOf(1), c)
	calls := len(f.calls())
	require.ErrorIs(t, d.StreamSynchronize(s), vmm.ErrInvalid, "a destroyed stream")
	require.ErrorIs(t, d.MemsetAsync(0x1000, 0, 1, s), vmm.ErrInvalid)
	require.ErrorIs(t, d.StreamDestroy(s), vmm.ErrInvalid)
	require.Len(t, f.calls(), calls, "a destroyed stream reached the driver")

	f.failNext("streamCreate", ErrorOutOfMemory)
	_, err = d.StreamCreate(0)
	requireResult(t, err, ErrorOutOfMemory, "cuStreamCreate on device 0")
	f.failNext("eventCreate", ErrorOutOfMemory)
	_, err = d.EventCreate(0)
	requireResult(t, err, ErrorOutOfMemory, "cuEventCreate on device 0")
	_, err = d.StreamCreate(5)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = d.EventCreate(5)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
}

// TestDeviceSynchronize checks cuCtxSynchronize in the device's context.
func TestDeviceSynchronize(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	require.NoError(t, d.DeviceSynchronize(1))
	c, _ := f.lastCtx("ctxSynchronize")
	require.Equal(t, ctxOf(1), c)
	f.failNext("ctxSynchronize", ErrorIllegalAddress)
	requireResult(t, d.DeviceSynchronize(0), ErrorIllegalAddress, "cuCtxSynchronize on device 0")
	require.ErrorIs(t, d.DeviceSynchronize(2), vmm.ErrInvalid)
}

// TestCopyContexts checks the context copies run in: that of a device
// allowed to touch every byte, the page's owner first and a peer with
// access after it, any context for plain allocations, and none (refused)
// where no device may.
func TestCopyContexts(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	p, h := mapFake(t, d, 1) // device 1's page, only device 1 has access
	a, err := d.MemAlloc(0, 100)
	require.NoError(t, err)
	c, _ := f.lastCtx("memAlloc")
	require.Equal(t, ctxOf(0), c)

	require.NoError(t, d.CopyHtoD(p, []byte("xseg")))
	c, _ = f.lastCtx("memcpyHtoD")
	require.Equal(t, ctxOf(1), c)
	require.NoError(t, d.CopyDtoD(a, p, 4))
	c, _ = f.lastCtx("memcpyDtoD")
	require.Equal(t, ctxOf(1), c, "a copy between a page and an allocation runs on the page's device")
	got := make([]byte, 4)
	require.NoError(t, d.CopyDtoH(got, a))
	c, _ = f.lastCtx("memcpyDtoH")
	require.Zero(t, c, "a copy from an allocation runs in any context")
	require.Equal(t, []byte("xseg"), got)

	// Device 0 gets read access and the owner loses its own: copies that
	// read go to device 0, writes are refused.
	require.NoError(t, d.SetAccess(p, gran, []vmm.AccessDesc{{Device: 1, Flags: vmm.AccessNone}, {Device: 0, Flags: vmm.AccessRead}}))
	require.NoError(t, d.CopyDtoH(got, p))
	c, _ = f.lastCtx("memcpyDtoH")
	require.Equal(t, ctxOf(0), c, "the owner may not read: the reader with access does")
	calls := len(f.calls())
	err = d.Memset(p, 0, 4)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Contains(t, err.Error(), "setting 4 bytes at")
	require.ErrorIs(t, d.CopyHtoD(p.Add(gran-2), []byte("xseg")), vmm.ErrInvalid, "a copy past the mapping")
	require.ErrorIs(t, d.CopyDtoD(p, a, 4), vmm.ErrInvalid)
	require.ErrorIs(t, d.CopyDtoH(got, 0x1000), vmm.ErrInvalid, "an address that is neither mapped nor allocated")
	require.ErrorIs(t, d.CopyHtoD(a.Add(98), []byte("xseg")), vmm.ErrInvalid, "a copy past the allocation's end")
	require.Len(t, f.calls(), calls, "a copy the books refuse reached the driver")
	// Nothing to copy is no call.
	require.NoError(t, d.CopyHtoD(0x1000, nil))
	require.NoError(t, d.CopyDtoH(nil, 0x1000))
	require.NoError(t, d.CopyDtoD(0x1000, 0x2000, 0))
	require.NoError(t, d.Memset(0x1000, 0, 0))
	require.NoError(t, d.MemsetAsync(0x1000, 0, 0, 0))
	require.Len(t, f.calls(), calls)

	for _, c := range []struct {
		call, want string
		do         func() error
	}{
		{"memcpyHtoD", "cuMemcpyHtoD", func() error { return d.CopyHtoD(a, []byte{1}) }},
		{"memcpyDtoH", "cuMemcpyDtoH", func() error { return d.CopyDtoH(got, a) }},
		{"memcpyDtoD", "cuMemcpy", func() error { return d.CopyDtoD(a, a.Add(50), 10) }},
		{"memsetD8", "cuMemsetD8", func() error { return d.Memset(a, 1, 10) }},
		{"memsetD8Async", "cuMemsetD8Async", func() error { return d.MemsetAsync(a, 1, 10, 0) }},
	} {
		f.failNext(c.call, ErrorIllegalAddress)
		requireResult(t, c.do(), ErrorIllegalAddress, c.want)
	}
	require.NoError(t, d.MemFree(a))
	unmapFake(t, d, p, h)
}

// TestMemsetAsyncStreams checks that a memset on a stream made here runs
// in the stream's context and only where its device may write, and that
// one on another stream picks a context as a copy does.
func TestMemsetAsyncStreams(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	p, h := mapFake(t, d, 1)
	s0, err := d.StreamCreate(0)
	require.NoError(t, err)
	s1, err := d.StreamCreate(1)
	require.NoError(t, err)
	err = d.MemsetAsync(p, 7, 10, s0)
	require.ErrorIs(t, err, vmm.ErrInvalid, "device 0's stream may not write device 1's page")
	require.Contains(t, err.Error(), "on stream")
	require.NoError(t, d.MemsetAsync(p, 7, 10, s1))
	c, _ := f.lastCtx("memsetD8Async")
	require.Equal(t, ctxOf(1), c)
	require.NoError(t, d.MemsetAsync(p, 8, 10, 0))
	c, _ = f.lastCtx("memsetD8Async")
	require.Equal(t, ctxOf(1), c, "stream 0: the context of a device that may write")
	got := make([]byte, 11)
	require.NoError(t, d.CopyDtoH(got, p))
	require.Equal(t, []byte{8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 0}, got)
	require.ErrorIs(t, d.MemsetAsync(0x1000, 7, 10, 0), vmm.ErrInvalid)
	require.NoError(t, d.StreamDestroy(s0))
	require.NoError(t, d.StreamDestroy(s1))
	unmapFake(t, d, p, h)
}

// TestMemAlloc checks plain allocations' argument checks and undo.
func TestMemAlloc(t *testing.T) {
	f := newFake(1, fakeTotal)
	d := openFake(t, f)
	calls := len(f.calls())
	_, err := d.MemAlloc(0, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = d.MemAlloc(0, fakeTotal+1)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	_, err = d.MemAlloc(1, 1)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Len(t, f.calls(), calls)
	f.failNext("memAlloc", ErrorOutOfMemory)
	_, err = d.MemAlloc(0, 1)
	requireResult(t, err, ErrorOutOfMemory, "cuMemAlloc of 1 bytes on device 0")
	require.True(t, d.Usage().Zero())

	a, err := d.MemAlloc(0, 1000)
	require.NoError(t, err)
	f.failNext("memFree", ErrorUnknown)
	requireResult(t, d.MemFree(a), ErrorUnknown, "cuMemFree")
	require.Equal(t, 1, d.Usage().Allocs, "a failed free forgot the allocation")
	require.NoError(t, d.MemFree(a))
	require.ErrorIs(t, d.MemFree(a), vmm.ErrInvalid)
}

// TestAllocIPC checks the legacy IPC of plain allocations over a fake that
// lets a process open its own handles: the open's checks and their undo,
// and a failed close that keeps the allocation open.
func TestAllocIPC(t *testing.T) {
	f := newFake(2, fakeTotal)
	f.ipcSelf = true
	d := openFake(t, f)
	a, err := d.MemAlloc(0, 3*gran/2)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(a.Add(10), []byte("ipc")))
	_, err = d.ExportAllocIPC(a.Add(1))
	require.ErrorIs(t, err, vmm.ErrInvalid)
	f.failNext("ipcGetMemHandle", ErrorUnknown)
	_, err = d.ExportAllocIPC(a)
	requireResult(t, err, ErrorUnknown, "cuIpcGetMemHandle")
	h, err := d.ExportAllocIPC(a)
	require.NoError(t, err)
	_, isFD := any(d).(vmm.AllocFD)
	require.False(t, isFD, "CUDA shares plain allocations through legacy IPC, not files")

	_, _, err = d.OpenAllocIPC(vmm.IPCMemHandle{}, 1)
	require.ErrorIs(t, err, vmm.ErrInvalid, "an all-zero handle")
	_, _, err = d.OpenAllocIPC(h, 2)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Zero(t, f.count("ipcOpenMemHandle"))
	f.failNext("ipcOpenMemHandle", ErrorInvalidContext)
	_, _, err = d.OpenAllocIPC(h, 1)
	requireResult(t, err, ErrorInvalidContext, "cuIpcOpenMemHandle on device 1")

	// The range query fails, or names another base: the open is closed.
	f.failNext("memGetAddressRange", ErrorUnknown)
	_, _, err = d.OpenAllocIPC(h, 1)
	requireResult(t, err, ErrorUnknown, "opening an IPC handle on device 1")
	require.Empty(t, f.mu.opened, "a failed open stayed open")
	f.failNext("memGetAddressRange", ErrorUnknown)
	f.failNext("ipcCloseMemHandle", ErrorInvalidValue)
	_, _, err = d.OpenAllocIPC(h, 1)
	require.ErrorIs(t, err, ErrorUnknown)
	require.ErrorIs(t, err, ErrorInvalidValue, "the failed close is reported beside the failure")
	require.Len(t, f.mu.opened, 1, "the open whose close failed")
	clear(f.mu.opened)
	require.Zero(t, d.Usage().IPCOpens)

	q, n, err := d.OpenAllocIPC(h, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(3*gran/2), n)
	c, _ := f.lastCtx("ipcOpenMemHandle")
	require.Equal(t, ctxOf(1), c, "opened in the named device's context")
	got := make([]byte, 3)
	require.NoError(t, d.CopyDtoH(got, q.Add(10)))
	require.Equal(t, []byte("ipc"), got)
	require.Equal(t, 1, d.Usage().IPCOpens)
	require.ErrorIs(t, d.MemFree(q), vmm.ErrInvalid)
	require.ErrorIs(t, d.CloseAllocIPC(a), vmm.ErrInvalid, "an allocation made here")

	// A second open the driver answers with the first one's address.
	f.ipcSameAddress = true
	_, _, err = d.OpenAllocIPC(h, 1)
	require.ErrorIs(t, err, vmm.ErrInUse)
	require.Equal(t, 1, d.Usage().IPCOpens)
	require.Contains(t, f.mu.opened, q, "undoing the second open closed the first")

	f.failNext("ipcCloseMemHandle", ErrorUnknown)
	requireResult(t, d.CloseAllocIPC(q), ErrorUnknown, "cuIpcCloseMemHandle")
	require.Equal(t, 1, d.Usage().IPCOpens, "a failed close forgot the open")
	require.NoError(t, d.CloseAllocIPC(q))
	require.ErrorIs(t, d.CloseAllocIPC(q), vmm.ErrInvalid)
	require.NoError(t, d.MemFree(a))
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
}

// offsetRange is a fake whose cuMemGetAddressRange names a base other than
// the address the open answered.
type offsetRange struct{ *fakeCUDA }

func (o offsetRange) memGetAddressRange(c cuContext, p vmm.DevicePtr) (vmm.DevicePtr, uint64, error) {
	base, size, err := o.fakeCUDA.memGetAddressRange(c, p)
	return base + 1, size, err
}

// TestAllocIPCWrongBase checks that an open whose range starts elsewhere
// is refused and closed.
func TestAllocIPCWrongBase(t *testing.T) {
	f := newFake(1, fakeTotal)
	f.ipcSelf = true
	d := openFake(t, f)
	a, err := d.MemAlloc(0, gran)
	require.NoError(t, err)
	h, err := d.ExportAllocIPC(a)
	require.NoError(t, err)
	d.sym = offsetRange{f}
	_, _, err = d.OpenAllocIPC(h, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Contains(t, err.Error(), "the opened allocation starts at")
	require.Empty(t, f.mu.opened)
	d.sym = f
	require.NoError(t, d.MemFree(a))
}
