package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// requireResult checks that err wraps the driver's code r, and that its
// text says what the call was doing (want).
func requireResult(t *testing.T, err error, r Result, want string) {
	t.Helper()
	require.Error(t, err)
	var got Result
	require.True(t, errors.As(err, &got), "%v does not wrap a Result", err)
	require.Equal(t, r, got, "%v", err)
	require.Contains(t, err.Error(), want)
}

// TestOpenFailures checks each way open can fail, and that a failure leaves
// no primary context retained.
func TestOpenFailures(t *testing.T) {
	cases := []struct {
		name, call string
		pass       int // calls of call to let through first
		want       string
	}{
		{"count", "deviceGetCount", 0, "cuDeviceGetCount"},
		{"get", "deviceGet", 0, "cuDeviceGet(0)"},
		{"total", "deviceTotalMem", 0, "cuDeviceTotalMem(0)"},
		{"attribute", "deviceGetAttribute", 0, "cuDeviceGetAttribute(102, 0)"},
		{"rdma attribute", "deviceGetAttribute", 3, "cuDeviceGetAttribute(110, 0)"},
		{"retain", "primaryCtxRetain", 0, "cuDevicePrimaryCtxRetain(0)"},
		// The first is the fabric probe's, whose failure is a "don't know".
		{"granularity", "granularity", 1, "cuMemGetAllocationGranularity of device 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(2, fakeTotal)
			f.failNext(c.call, append(make([]Result, c.pass), ErrorUnknown)...)
			d, err := open(f, 12080)
			require.Nil(t, d)
			requireResult(t, err, ErrorUnknown, c.want)
			require.Equal(t, []int{0, 0}, f.retained(), "a failed open keeps a context")
		})
	}
	t.Run("no device", func(t *testing.T) {
		d, err := open(newFake(0, fakeTotal), 12080)
		require.Nil(t, d)
		require.ErrorIs(t, err, vmm.ErrNotSupported)
		require.Contains(t, err.Error(), "sees no device")
	})
	// Answers the books cannot use are refused, not a panic of ledger.New.
	for _, g := range []uint64{0, 3 << 20} {
		t.Run(fmt.Sprintf("granularity %d", g), func(t *testing.T) {
			f := newFake(2, fakeTotal)
			f.gran = g
			d, err := open(f, 12080)
			require.Nil(t, d)
			require.ErrorIs(t, err, vmm.ErrNotSupported)
			require.Contains(t, err.Error(), "not a power of two")
			require.Equal(t, []int{0, 0}, f.retained(), "a failed open keeps a context")
		})
	}
}

// TestOpenState checks what open leaves: device 0's context retained and
// made the fallback, the others untouched until first used, and Close
// releasing each once.
func TestOpenState(t *testing.T) {
	f := newFake(3, fakeTotal)
	d := openFake(t, f)
	require.Equal(t, []int{1, 0, 0}, f.retained())
	require.Equal(t, ctxOf(0), f.mu.fallback)
	v, err := d.DriverVersion()
	require.NoError(t, err)
	require.Equal(t, 12080, v)
	n, err := d.DeviceCount()
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Equal(t, "cuda", d.Backend())

	info, err := d.DeviceInfo(2)
	require.NoError(t, err)
	require.Equal(t, []int{1, 0, 1}, f.retained(), "DeviceInfo(2) retains device 2's context only")
	require.Equal(t, vmm.DeviceInfo{Ordinal: 2, Name: "Fake GPU 2", UUID: [16]byte{0xfa, 0xce, 15: 3},
		TotalMemory: fakeTotal, VMM: true, PosixFD: true, Fabric: true, RDMAWithVMM: true,
		Granularity: 2 << 20, RecommendedGranularity: 4 << 20}, info)
	_, err = d.DeviceInfo(2)
	require.NoError(t, err)
	require.Equal(t, []int{1, 0, 1}, f.retained(), "a device is retained once")

	free, total, err := d.MemInfo(1)
	require.NoError(t, err)
	require.Equal(t, uint64(fakeTotal), free)
	require.Equal(t, uint64(fakeTotal), total)
	c, _ := f.lastCtx("memGetInfo")
	require.Equal(t, ctxOf(1), c, "MemInfo(1) asks in device 1's context")

	for _, dev := range []vmm.Device{-1, 3} {
		_, err = d.DeviceInfo(dev)
		require.ErrorIs(t, err, vmm.ErrInvalid, "DeviceInfo(%d)", dev)
	}
}

// TestCloseReleaseFailure checks that Close goes on releasing after a
// failure, reports the first, and is idempotent.
func TestCloseReleaseFailure(t *testing.T) {
	f := newFake(3, fakeTotal)
	d, err := open(f, 12080)
	require.NoError(t, err)
	_, _, err = d.MemInfo(1)
	require.NoError(t, err)
	_, _, err = d.MemInfo(2)
	require.NoError(t, err)
	f.failNext("primaryCtxRelease", ErrorInvalidValue, ErrorUnknown)
	err = d.Close()
	requireResult(t, err, ErrorInvalidValue, "cuDevicePrimaryCtxRelease(0)")
	require.Equal(t, 3, f.count("primaryCtxRelease"))
	require.Equal(t, []int{1, 1, 0}, f.retained())
	require.NoError(t, d.Close())
	require.Equal(t, 3, f.count("primaryCtxRelease"), "a second Close releases nothing")
}

// TestDeviceInfoFailures checks that DeviceInfo and MemInfo wrap the
// driver's failures, and that a failed first use of a device retains
// nothing and can be tried again.
func TestDeviceInfoFailures(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	for _, c := range []struct {
		call string
		rs   []Result
		want string
	}{
		{"deviceGetName", []Result{ErrorUnknown}, "cuDeviceGetName(0)"},
		{"deviceGetUUID", []Result{ErrorUnknown}, "cuDeviceGetUuid(0)"},
		{"granularity", []Result{ErrorUnknown}, "cuMemGetAllocationGranularity(0, minimum)"},
		{"granularity", []Result{0, ErrorUnknown}, "cuMemGetAllocationGranularity(0, recommended)"},
	} {
		f.failNext(c.call, c.rs...)
		_, err := d.DeviceInfo(0)
		requireResult(t, err, ErrorUnknown, c.want)
	}

	f.failNext("primaryCtxRetain", ErrorOutOfMemory)
	_, err := d.DeviceInfo(1)
	requireResult(t, err, ErrorOutOfMemory, "cuDevicePrimaryCtxRetain(1)")
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.Equal(t, []int{1, 0}, f.retained())
	_, err = d.DeviceInfo(1)
	require.NoError(t, err, "a device whose first use failed works on the next")

	f.failNext("memGetInfo", ErrorUnknown)
	_, _, err = d.MemInfo(1)
	requireResult(t, err, ErrorUnknown, "cuMemGetInfo(1)")
	_, _, err = d.MemInfo(7)
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

// TestDeviceWithoutVMM checks a device 0 without VMM: the books take the
// default granularity, and reserving or making pages is not supported,
// refused before the driver is asked.
func TestDeviceWithoutVMM(t *testing.T) {
	f := newFake(1, fakeTotal)
	f.devs[0].attrs[attrVMM] = 0
	d := openFake(t, f)
	require.Zero(t, f.count("granularity"))
	info, err := d.DeviceInfo(0)
	require.NoError(t, err)
	require.False(t, info.VMM)
	require.Zero(t, info.Granularity)
	_, err = d.Reserve(2<<20, 0)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	_, err = d.Create(0, 2<<20, vmm.HandleNone)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.Zero(t, f.count("memAddressReserve")+f.count("memCreate"))
}

// TestFabricProbe checks the three answers of the fabric probe: no (the
// driver refuses fabric pages as not supported or not permitted), yes,
// and "don't know" (any other failure), which keeps the attribute's yes;
// and that the probe page is released.
func TestFabricProbe(t *testing.T) {
	cases := []struct {
		name   string
		create Result // what a fabric cuMemCreate answers
		gran   bool   // the probe's granularity query fails
		want   bool
	}{
		{"works", 0, false, true},
		{"not permitted", ErrorNotPermitted, false, false},
		{"not supported", ErrorNotSupported, false, false},
		{"unknown", ErrorUnknown, false, true},
		{"no granularity", 0, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(2, fakeTotal)
			f.devs[1].fabricE = c.create
			d := openFake(t, f)
			if c.gran {
				f.failNext("granularity", ErrorUnknown)
			}
			info, err := d.DeviceInfo(1)
			require.NoError(t, err)
			require.Equal(t, c.want, info.Fabric)
			require.Zero(t, f.devs[1].used, "the probe page was not released")
			require.True(t, d.Usage().Zero(), "the probe page is not in the books")
			h, err := d.Create(1, 2<<20, vmm.HandleFabric)
			if !c.want {
				require.ErrorIs(t, err, vmm.ErrNotSupported)
			} else if c.create != 0 {
				requireResult(t, err, c.create, "cuMemCreate of 2097152 bytes on device 1")
			}
			if err == nil {
				require.NoError(t, d.Release(h))
			}
		})
	}
}

// TestClosedDriver checks that every method of a closed Driver fails with
// vmm.ErrClosed without calling the driver, and that a Driver not made by
// Open fails every method the same way as one built without cgo would.
func TestClosedDriver(t *testing.T) {
	f := newFake(1, fakeTotal)
	d, err := open(f, 12080)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	before := len(f.calls())
	for name, err := range everyMethod(d) {
		require.ErrorIs(t, err, vmm.ErrClosed, name)
	}
	require.Len(t, f.calls(), before, "a closed Driver called the driver")
	require.True(t, d.Usage().Zero())

	var zero Driver
	for name, err := range everyMethod(&zero) {
		require.ErrorIs(t, err, vmm.ErrNotSupported, name)
		require.ErrorIs(t, err, errUnopened, name)
	}
	require.True(t, zero.Usage().Zero())
	require.NoError(t, zero.Close())
}

// everyMethod calls each method of d that can fail, with arguments that
// would do, and returns their errors by name.
func everyMethod(d *Driver) map[string]error {
	errs := map[string]error{}
	_, errs["DriverVersion"] = d.DriverVersion()
	_, errs["DeviceCount"] = d.DeviceCount()
	_, errs["DeviceInfo"] = d.DeviceInfo(0)
	_, _, errs["MemInfo"] = d.MemInfo(0)
	_, errs["Reserve"] = d.Reserve(2<<20, 0)
	errs["Unreserve"] = d.Unreserve(0x7f00_0000_0000, 2<<20)
	_, errs["Create"] = d.Create(0, 2<<20, vmm.HandleNone)
	errs["Release"] = d.Release(1)
	errs["Map"] = d.Map(0x7f00_0000_0000, 2<<20, 1, 0)
	errs["Unmap"] = d.Unmap(0x7f00_0000_0000, 2<<20)
	errs["SetAccess"] = d.SetAccess(0x7f00_0000_0000, 2<<20, vmm.ReadWrite(0))
	_, errs["GetAccess"] = d.GetAccess(0x7f00_0000_0000, 0)
	_, errs["ExportFD"] = d.ExportFD(1)
	_, errs["ImportFD"] = d.ImportFD(3)
	_, errs["ExportFabric"] = d.ExportFabric(1)
	_, errs["ImportFabric"] = d.ImportFabric(vmm.FabricHandle{1})
	_, errs["StreamCreate"] = d.StreamCreate(0)
	errs["StreamDestroy"] = d.StreamDestroy(1)
	errs["StreamSynchronize"] = d.StreamSynchronize(0)
	errs["DeviceSynchronize"] = d.DeviceSynchronize(0)
	_, errs["EventCreate"] = d.EventCreate(0)
	errs["EventRecord"] = d.EventRecord(1, 0)
	_, errs["EventQuery"] = d.EventQuery(1)
	errs["EventSynchronize"] = d.EventSynchronize(1)
	errs["EventDestroy"] = d.EventDestroy(1)
	errs["CopyHtoD"] = d.CopyHtoD(0x7f00_0000_0000, []byte{1})
	errs["CopyDtoH"] = d.CopyDtoH(make([]byte, 1), 0x7f00_0000_0000)
	errs["CopyDtoD"] = d.CopyDtoD(0x7f00_0000_0000, 0x7f00_0000_1000, 1)
	errs["Memset"] = d.Memset(0x7f00_0000_0000, 1, 1)
	errs["MemsetAsync"] = d.MemsetAsync(0x7f00_0000_0000, 1, 1, 0)
	_, errs["MemAlloc"] = d.MemAlloc(0, 1)
	errs["MemFree"] = d.MemFree(0x7f00_0000_0000)
	_, errs["ExportAllocIPC"] = d.ExportAllocIPC(0x7f00_0000_0000)
	_, _, errs["OpenAllocIPC"] = d.OpenAllocIPC(vmm.IPCMemHandle{1}, 0)
	errs["CloseAllocIPC"] = d.CloseAllocIPC(0x7f00_0000_0000)
	return errs
}
