package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

const gran = 2 << 20 // the fake's granularity

// TestReserveCreateFailures checks that a reservation or page the driver
// refuses is not recorded, and that misuse is refused before the driver is
// asked.
func TestReserveCreateFailures(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)

	f.failNext("memAddressReserve", ErrorOutOfMemory)
	_, err := d.Reserve(4*gran, 0)
	requireResult(t, err, ErrorOutOfMemory, "cuMemAddressReserve of 8388608 bytes aligned to 2097152")
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.True(t, d.Usage().Zero())

	p, err := d.Reserve(gran, 1024)
	require.NoError(t, err)
	require.Zero(t, uint64(p)%gran, "an alignment below the granularity is raised to it")
	require.NoError(t, d.Unreserve(p, gran))
	p, err = d.Reserve(gran, 8*gran)
	require.NoError(t, err)
	require.Zero(t, uint64(p)%(8*gran))
	require.NoError(t, d.Unreserve(p, gran))

	calls := len(f.calls())
	_, err = d.Reserve(gran, 3*gran)
	require.ErrorIs(t, err, vmm.ErrInvalid, "an alignment that is no power of two")
	_, err = d.Reserve(gran+1, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid, "a size off the granularity")
	for _, c := range []struct {
		dev   vmm.Device
		size  uint64
		types vmm.HandleType
		want  error
	}{
		{2, gran, vmm.HandleNone, vmm.ErrInvalid},
		{0, gran / 2, vmm.HandleNone, vmm.ErrInvalid},
		{0, gran, 0x40, vmm.ErrInvalid},
		{0, 2 * fakeTotal, vmm.HandleNone, vmm.ErrOutOfMemory},
	} {
		_, err = d.Create(c.dev, c.size, c.types)
		require.ErrorIs(t, err, c.want, "Create(%d, %d, %v)", c.dev, c.size, c.types)
	}
	require.Len(t, f.calls(), calls, "misuse reached the driver")

	_, err = d.DeviceInfo(1) // device 1's first use probes with a cuMemCreate
	require.NoError(t, err)
	f.failNext("memCreate", ErrorOutOfMemory)
	_, err = d.Create(1, gran, vmm.HandlePosixFD)
	requireResult(t, err, ErrorOutOfMemory, "cuMemCreate of 2097152 bytes on device 1")
	require.True(t, d.Usage().Zero())
	c, _ := f.lastCtx("memCreate")
	require.Zero(t, c, "cuMemCreate runs in any context")
}

// TestCreateWithoutCapabilities checks the handle types a device lacks.
func TestCreateWithoutCapabilities(t *testing.T) {
	f := newFake(1, fakeTotal)
	f.devs[0].attrs[attrPosixFD] = 0
	f.devs[0].attrs[attrFabric] = 0
	d := openFake(t, f)
	for _, types := range []vmm.HandleType{vmm.HandlePosixFD, vmm.HandleFabric} {
		_, err := d.Create(0, gran, types)
		require.ErrorIs(t, err, vmm.ErrNotSupported, "%v", types)
	}
	h, err := d.Create(0, gran, vmm.HandleNone)
	require.NoError(t, err)
	_, err = d.ExportFabric(h)
	require.ErrorIs(t, err, vmm.ErrNotSupported, "ExportFabric on a device without fabric handles")
	_, err = d.ExportFD(h)
	require.ErrorIs(t, err, vmm.ErrInvalid, "ExportFD of a page made without HandlePosixFD")
	_, err = d.ImportFabric(vmm.FabricHandle{1})
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.NoError(t, d.Release(h))
	require.Zero(t, f.count("memExportFabric")+f.count("memExportFD")+f.count("memImportFabric"))
}

// TestUndo checks that each transition the driver refuses leaves the books
// as they were: the call can be made again, and succeeds.
func TestUndo(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	p, err := d.Reserve(4*gran, 0)
	require.NoError(t, err)
	h, err := d.Create(0, 2*gran, vmm.HandleNone)
	require.NoError(t, err)
	h2, err := d.Create(0, gran, vmm.HandleNone)
	require.NoError(t, err)
	before := d.Usage()

	f.failNext("memMap", ErrorUnknown)
	err = d.Map(p, 2*gran, h, 0)
	requireResult(t, err, ErrorUnknown, "cuMemMap")
	require.NotContains(t, err.Error(), "whole pages")
	require.Equal(t, before, d.Usage(), "a failed Map left a mapping")
	f.failNext("memMap", ErrorNotSupported)
	err = d.Map(p, 2*gran, h, 0)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.Contains(t, err.Error(), "CUDA maps whole pages only")
	require.NoError(t, d.Map(p, 2*gran, h, 0))
	require.NoError(t, d.Map(p.Add(2*gran), gran, h2, 0))
	mapped := d.Usage()
	require.Equal(t, 2, mapped.Mappings)

	f.failNext("memSetAccess", ErrorInvalidDevice)
	err = d.SetAccess(p, 3*gran, vmm.ReadWrite(0))
	requireResult(t, err, ErrorInvalidDevice, "cuMemSetAccess")
	require.ErrorIs(t, d.CopyHtoD(p, []byte{1}), vmm.ErrInvalid, "a failed SetAccess granted access in the books")
	require.NoError(t, d.SetAccess(p, 3*gran, vmm.ReadWrite(0)))
	require.NoError(t, d.CopyHtoD(p.Add(2*gran), []byte{1}))
	// A failed change keeps the access granted before.
	f.failNext("memSetAccess", ErrorUnknown)
	require.Error(t, d.SetAccess(p, 3*gran, []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessRead}}))
	require.NoError(t, d.CopyHtoD(p, []byte{1}), "read-write access lost to a failed SetAccess")
	a, err := d.GetAccess(p, 0)
	require.NoError(t, err)
	require.Equal(t, vmm.AccessReadWrite, a)

	// Unmap of two mappings whose second unmap fails: the first is gone,
	// the second stays, and a second Unmap of it works.
	f.failNext("memUnmap", 0, ErrorUnknown)
	err = d.Unmap(p, 3*gran)
	requireResult(t, err, ErrorUnknown, "(mapping 2 of 2 in ")
	require.Contains(t, err.Error(), "1 unmapped, 1 still mapped")
	u := d.Usage()
	require.Equal(t, 1, u.Mappings)
	require.Equal(t, uint64(gran), u.MappedBytes)
	require.ErrorIs(t, d.Unmap(p, 3*gran), vmm.ErrInvalid, "the first mapping is gone")
	require.NoError(t, d.CopyHtoD(p.Add(2*gran), []byte{2}), "the mapping that stayed keeps its access")
	require.NoError(t, d.Unmap(p.Add(2*gran), gran))

	f.failNext("memRelease", ErrorUnknown)
	requireResult(t, d.Release(h), ErrorUnknown, "cuMemRelease")
	require.Equal(t, 2, d.Usage().Handles)
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Release(h2))
	require.ErrorIs(t, d.Release(h2), vmm.ErrInvalid, "a double release")

	f.failNext("memAddressFree", ErrorUnknown)
	requireResult(t, d.Unreserve(p, 4*gran), ErrorUnknown, "cuMemAddressFree")
	require.Equal(t, 1, d.Usage().Ranges)
	require.NoError(t, d.Unreserve(p, 4*gran))
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
}

// TestSetAccessDevices checks that SetAccess refuses a device the driver
// does not have before anything else.
func TestSetAccessDevices(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	for _, dev := range []vmm.Device{-1, 2} {
		err := d.SetAccess(0x1000, gran, vmm.ReadWrite(dev))
		require.ErrorIs(t, err, vmm.ErrInvalid)
		require.Contains(t, err.Error(), "the driver has 2 devices")
	}
	require.Zero(t, f.count("memSetAccess"))
}

// TestGetAccess checks that GetAccess asks the driver only about mapped
// addresses, and wraps its failure.
func TestGetAccess(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	p, h := mapFake(t, d, 0)
	_, err := d.GetAccess(p.Add(gran), 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = d.GetAccess(p, 2)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Zero(t, f.count("memGetAccess"))
	a, err := d.GetAccess(p, 1)
	require.NoError(t, err)
	require.Equal(t, vmm.AccessNone, a)
	f.failNext("memGetAccess", ErrorUnknown)
	_, err = d.GetAccess(p, 0)
	requireResult(t, err, ErrorUnknown, "cuMemGetAccess at")
	unmapFake(t, d, p, h)
}

// mapFake reserves, makes and maps one read-write granule on dev.
func mapFake(t *testing.T, d *Driver, dev vmm.Device) (vmm.DevicePtr, vmm.Handle) {
	t.Helper()
	p, err := d.Reserve(gran, 0)
	require.NoError(t, err)
	h, err := d.Create(dev, gran, vmm.HandlePosixFD|vmm.HandleFabric)
	require.NoError(t, err)
	require.NoError(t, d.Map(p, gran, h, 0))
	require.NoError(t, d.SetAccess(p, gran, vmm.ReadWrite(dev)))
	return p, h
}

// unmapFake undoes mapFake.
func unmapFake(t *testing.T, d *Driver, p vmm.DevicePtr, h vmm.Handle) {
	t.Helper()
	require.NoError(t, d.Unmap(p, gran))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Unreserve(p, gran))
}

// sameHandle is a fake whose imports hand back a handle chosen by the test,
// as a driver may for a page this process already holds.
type sameHandle struct {
	*fakeCUDA
	h vmm.Handle
}

func (s sameHandle) memImportFD(c cuContext, fd int) (vmm.Handle, error) {
	if _, err := s.fakeCUDA.memImportFD(c, fd); err != nil {
		return 0, err
	}
	return s.h, nil
}

// TestImportFailures checks the imports' failure paths: the driver's
// refusal, a handle already live here, and properties the driver cannot
// give or that name a device it does not have, after which the imported
// page is released.
func TestImportFailures(t *testing.T) {
	f := newFake(2, fakeTotal)
	d := openFake(t, f)
	p, h := mapFake(t, d, 1)
	fd, err := d.ExportFD(h)
	require.NoError(t, err)
	defer func() { require.NoError(t, closeFakeFD(fd)) }()

	_, err = d.ImportFD(-1)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	f.failNext("memImportFD", ErrorInvalidValue)
	_, err = d.ImportFD(fd)
	requireResult(t, err, ErrorInvalidValue, "cuMemImportFromShareableHandle(fd ")

	f.failNext("memAllocationProperties", ErrorUnknown)
	_, err = d.ImportFD(fd)
	requireResult(t, err, ErrorUnknown, "cuMemGetAllocationPropertiesFromHandle")
	f.failNext("memAllocationProperties", ErrorUnknown)
	f.failNext("memRelease", ErrorInvalidValue)
	_, err = d.ImportFD(fd)
	requireResult(t, err, ErrorUnknown, "and cuMemRelease of the imported handle: CUDA_ERROR_INVALID_VALUE")
	require.Equal(t, 1, d.Usage().Handles, "a failed import is in the books")

	imp, err := d.ImportFD(fd)
	require.NoError(t, err)
	c, _ := f.lastCtx("memImportFD")
	require.Zero(t, c)
	u := d.Usage()
	require.Equal(t, 2, u.Handles)
	require.Equal(t, uint64(gran+fakeTotal), u.HandleBytes, "an import counts with the device's memory as its bound")

	// The driver hands back the handle of a page this process holds.
	d.sym = sameHandle{f, imp}
	_, err = d.ImportFD(fd)
	require.ErrorIs(t, err, vmm.ErrInUse)
	d.sym = f
	require.NoError(t, d.Release(imp), "the page a refused import named is still there")

	// A page of a device the driver does not list.
	f.mu.pages[h].mem.dev = 2
	released := f.count("memRelease")
	_, err = d.ImportFD(fd)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Equal(t, released+1, f.count("memRelease"), "the import was not released")
	f.mu.pages[h].mem.dev = 1

	fh, err := d.ExportFabric(h)
	require.NoError(t, err)
	f.failNext("memImportFabric", ErrorNotPermitted)
	_, err = d.ImportFabric(fh)
	requireResult(t, err, ErrorNotPermitted, "cuMemImportFromShareableHandle(fabric)")
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	f.failNext("memAllocationProperties", ErrorUnknown)
	_, err = d.ImportFabric(fh)
	require.Error(t, err)
	imp, err = d.ImportFabric(fh)
	require.NoError(t, err)
	require.NoError(t, d.Release(imp))

	f.failNext("memExportFD", ErrorUnknown)
	_, err = d.ExportFD(h)
	requireResult(t, err, ErrorUnknown, "posix fd")
	f.failNext("memExportFabric", ErrorUnknown)
	_, err = d.ExportFabric(h)
	requireResult(t, err, ErrorUnknown, "fabric")
	_, err = d.ExportFD(0x5eed)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	unmapFake(t, d, p, h)
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
}
