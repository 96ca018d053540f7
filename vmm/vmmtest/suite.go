package vmmtest

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// Config describes the backend the conformance suite runs against.
type Config struct {
	// Name names the backend in failure messages.
	Name string
	// Open opens a fresh driver. It may skip t (no driver on this machine)
	// and must fail it when opening fails for another reason. Run closes
	// the driver after each subtest.
	Open func(t testing.TB) vmm.Driver
	// Device is the device the suite makes its pages on.
	Device vmm.Device
	// CrossProcess also runs the importer of the export/import test in a
	// child process; the test binary's TestMain must call ChildMain.
	CrossProcess bool
}

// Run runs the conformance suite as subtests of t. The subtests are
// independent; none runs in parallel with another (the fd leak check
// needs that), and Run must not be called from parallel tests.
func Run(t *testing.T, c Config) {
	require.NotNil(t, c.Open, "vmmtest.Config.Open")
	warmUp(t, c)
	for _, s := range suite {
		t.Run(s.name, func(t *testing.T) {
			s.fn(t, c)
		})
	}
}

type subtest struct {
	name string
	fn   func(*testing.T, Config)
}

// suite lists the subtests in the order they run.
var suite = []subtest{
	{"Devices", testDevices},
	{"DeviceOutOfRange", testDeviceOutOfRange},
	{"Reserve", testReserve},
	{"Unreserve", testUnreserve},
	{"CreateRelease", testCreateRelease},
	{"CreateOutOfMemory", testCreateOutOfMemory},
	{"MemInfoFollowsPages", testMemInfoFollowsPages},
	{"Map", testMap},
	{"MapPart", testMapPart},
	{"MapErrors", testMapErrors},
	{"Unmap", testUnmap},
	{"SetAccess", testSetAccess},
	{"GetAccess", testGetAccess},
	{"PeerAccess", testPeerAccess},
	{"Usage", testUsage},
	{"CopyRoundTrip", testCopyRoundTrip},
	{"CopyUnmapped", testCopyUnmapped},
	{"Memset", testMemset},
	{"CopyDtoD", testCopyDtoD},
	{"WrapAround", testWrapAround},
	{"Alias", testAlias},
	{"MemAlloc", testMemAlloc},
	{"AllocShare", testAllocShare},
	{"ExportImport", testExportImport},
	{"CrossProcess", testCrossProcess},
	{"ExportWithoutPosixFD", testExportWithoutPosixFD},
	{"Fabric", testFabric},
	{"Streams", testStreams},
	{"Events", testEvents},
	{"EventOtherDevice", testEventOtherDevice},
	{"Concurrent", testConcurrent},
	{"Closed", testClosed},
}

// env is what one subtest works with: a fresh driver whose leaks are checked
// when the subtest ends, and the device under test.
type env struct {
	t    *testing.T
	d    vmm.Driver
	dev  vmm.Device
	info vmm.DeviceInfo
	gran uint64
}

// open opens a fresh driver for t, checks it for leaks when t ends, closes
// it after that, and requires the device to support VMM.
func open(t *testing.T, c Config) *env {
	t.Helper()
	e := openAny(t, c)
	e.need(e.info.VMM, "%s: device %d reports no VMM support", c.Name, c.Device)
	return e
}

// need skips the test with the reason unless the device has a capability
// the test needs. Under XSEG_REQUIRE_GPU=1 a GPU backend must have it: the
// test fails instead, so that a wrong capability report cannot turn the
// suite green by skipping.
func (e *env) need(has bool, format string, args ...any) {
	e.t.Helper()
	if has {
		return
	}
	if os.Getenv("XSEG_REQUIRE_GPU") == "1" && e.d.Backend() != "host" {
		e.t.Fatalf("XSEG_REQUIRE_GPU=1: "+format, args...)
	}
	e.t.Skipf(format, args...)
}

// openAny is open without the VMM requirement.
func openAny(t *testing.T, c Config) *env {
	t.Helper()
	d := c.Open(t)
	require.NotNil(t, d, "%s: Open returned a nil driver", c.Name)
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("%s: closing the driver: %v", c.Name, err)
		}
	})
	CheckLeaks(t, d)
	info, err := d.DeviceInfo(c.Device)
	require.NoError(t, err, "%s: DeviceInfo(%d)", c.Name, c.Device)
	require.NotZero(t, info.Granularity, "%s: granularity", c.Name)
	return &env{t: t, d: d, dev: c.Device, info: info, gran: info.Granularity}
}

// gone reports whether a cleanup's error means the object was already given
// back by the test itself.
func gone(err error) bool { return err == nil || errors.Is(err, vmm.ErrInvalid) }

// reserve reserves size bytes and unreserves them when the test ends,
// unless the test did.
func (e *env) reserve(size uint64) vmm.DevicePtr {
	e.t.Helper()
	ptr, err := e.d.Reserve(size, 0)
	require.NoError(e.t, err, "Reserve(%d, 0)", size)
	require.NotZero(e.t, ptr, "Reserve returned address 0")
	require.Zero(e.t, uint64(ptr)%e.gran, "Reserve returned %v, not aligned to %d", ptr, e.gran)
	e.t.Cleanup(func() {
		if err := e.d.Unreserve(ptr, size); !gone(err) {
			e.t.Errorf("cleanup: Unreserve(%v, %d): %v", ptr, size, err)
		}
	})
	return ptr
}

// create makes a page of size bytes on the device under test and releases
// it when the test ends, unless the test did.
func (e *env) create(size uint64, types vmm.HandleType) vmm.Handle {
	e.t.Helper()
	h, err := e.d.Create(e.dev, size, types)
	require.NoError(e.t, err, "Create(%d, %d, %v)", e.dev, size, types)
	e.releaseLater(h)
	return h
}

// releaseLater releases h when the test ends, unless the test did.
func (e *env) releaseLater(h vmm.Handle) {
	e.t.Cleanup(func() {
		if err := e.d.Release(h); !gone(err) {
			e.t.Errorf("cleanup: Release(%#x): %v", uint64(h), err)
		}
	})
}

// mapPage maps size bytes of h from offset at ptr and unmaps them when the
// test ends, unless the test did.
func (e *env) mapPage(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) {
	e.t.Helper()
	require.NoError(e.t, e.d.Map(ptr, size, h, offset), "Map(%v, %d, %#x, %d)", ptr, size, uint64(h), offset)
	e.t.Cleanup(func() {
		if err := e.d.Unmap(ptr, size); !gone(err) {
			e.t.Errorf("cleanup: Unmap(%v, %d): %v", ptr, size, err)
		}
	})
}

// mapRW maps h at ptr and grants the device under test read and write
// access.
func (e *env) mapRW(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) {
	e.t.Helper()
	e.mapPage(ptr, size, h, offset)
	require.NoError(e.t, e.d.SetAccess(ptr, size, vmm.ReadWrite(e.dev)), "SetAccess(%v, %d)", ptr, size)
}

// backed reserves, creates and maps pages*gran bytes readable and writable
// by the device under test.
func (e *env) backed(pages int) (vmm.DevicePtr, vmm.Handle) {
	e.t.Helper()
	size := uint64(pages) * e.gran
	ptr := e.reserve(size)
	h := e.create(size, vmm.HandleNone)
	e.mapRW(ptr, size, h, 0)
	return ptr, h
}

// pattern returns n bytes that depend on seed and on their position, so
// that a copy to the wrong place or of the wrong length shows.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31+i>>8) ^ seed
	}
	return b
}

// write copies data to ptr.
func (e *env) write(ptr vmm.DevicePtr, data []byte) {
	e.t.Helper()
	require.NoError(e.t, e.d.CopyHtoD(ptr, data), "CopyHtoD(%v, %d bytes)", ptr, len(data))
}

// read copies n bytes from ptr.
func (e *env) read(ptr vmm.DevicePtr, n int) []byte {
	e.t.Helper()
	b := make([]byte, n)
	require.NoError(e.t, e.d.CopyDtoH(b, ptr), "CopyDtoH(%d bytes, %v)", n, ptr)
	return b
}

// requireIs fails t unless err matches target.
func requireIs(t *testing.T, err, target error, what string, args ...any) {
	t.Helper()
	msg := append([]any{what}, args...)
	require.Error(t, err, msg...)
	require.ErrorIs(t, err, target, msg...)
}
