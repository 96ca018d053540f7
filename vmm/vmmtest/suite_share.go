package vmmtest

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// exportFD exports h and closes the fd when the test ends, unless the test
// closed it first. The fd is held in an *os.File so that a second close is
// harmless instead of closing whatever took the number since.
func (e *env) exportFD(h vmm.Handle) *os.File {
	e.t.Helper()
	fd, err := e.d.ExportFD(h)
	require.NoError(e.t, err, "ExportFD(%#x)", uint64(h))
	require.GreaterOrEqual(e.t, fd, 0, "ExportFD returned fd %d", fd)
	f := os.NewFile(uintptr(fd), "vmmtest-exported-page")
	e.t.Cleanup(func() {
		if err := f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			e.t.Errorf("cleanup: closing exported fd %d: %v", fd, err)
		}
	})
	return f
}

// isInvalidOrUnsupported reports whether err is ErrInvalid or
// ErrNotSupported: either is a right answer to a request the page's handle
// types do not allow.
func isInvalidOrUnsupported(err error) bool {
	return errors.Is(err, vmm.ErrInvalid) || errors.Is(err, vmm.ErrNotSupported)
}

// testExportImport exports a page as an fd, imports it in this process and
// checks that the mappings share bytes both ways.
func testExportImport(t *testing.T, c Config) {
	e := open(t, c)
	e.need(e.info.PosixFD, "%s: device %d reports no POSIX fd handles", c.Name, e.dev)
	size := 2 * e.gran
	h := e.create(size, vmm.HandlePosixFD)
	p := e.reserve(size)
	e.mapRW(p, size, h, 0)
	f := e.exportFD(h)
	fd := int(f.Fd())

	imp, err := e.d.ImportFD(fd)
	require.NoError(t, err, "ImportFD(%d)", fd)
	e.releaseLater(imp)
	q := e.reserve(size)
	e.mapRW(q, size, imp, 0)
	data := pattern(int(size), 7)
	e.write(p, data)
	require.True(t, bytes.Equal(data, e.read(q, len(data))), "bytes written through the exporter's mapping, read through the importer's")
	e.write(q.Add(e.gran+5), []byte("reply"))
	require.Equal(t, []byte("reply"), e.read(p.Add(e.gran+5), 5), "bytes written through the importer's mapping")

	// The fd was not consumed by the import: a second import works, and
	// the page lives on after the exporter's handle is gone.
	imp2, err := e.d.ImportFD(fd)
	require.NoError(t, err, "second ImportFD(%d)", fd)
	e.releaseLater(imp2)
	require.NoError(t, f.Close(), "closing the exported fd")
	require.NoError(t, e.d.Unmap(p, size))
	require.NoError(t, e.d.Release(h))
	r := e.reserve(size)
	e.mapRW(r, size, imp2, 0)
	require.Equal(t, []byte("reply"), e.read(r.Add(e.gran+5), 5), "bytes through an import of a released page")

	_, err = e.d.ImportFD(-1)
	requireIs(t, err, vmm.ErrInvalid, "ImportFD(-1)")
}

// testExportWithoutPosixFD checks that a page made without HandlePosixFD
// cannot be exported as an fd, and that released pages cannot be exported.
func testExportWithoutPosixFD(t *testing.T, c Config) {
	e := open(t, c)
	h := e.create(e.gran, vmm.HandleNone)
	fd, err := e.d.ExportFD(h)
	if err == nil {
		_ = closeFD(fd)
		t.Fatalf("ExportFD of a page created without HandlePosixFD returned fd %d", fd)
	}
	require.True(t, isInvalidOrUnsupported(err), "ExportFD of a page created without HandlePosixFD: %v", err)
	require.NoError(t, e.d.Release(h))
	_, err = e.d.ExportFD(h)
	requireIs(t, err, vmm.ErrInvalid, "ExportFD of a released page")
}

// testFabric checks fabric handles: a round trip where the device has them,
// ErrNotSupported where it has not, ErrInvalid for a page that is not live
// either way.
func testFabric(t *testing.T, c Config) {
	e := open(t, c)
	dead := e.create(e.gran, vmm.HandleNone)
	require.NoError(t, e.d.Release(dead))
	_, err := e.d.ExportFabric(dead)
	requireIs(t, err, vmm.ErrInvalid, "ExportFabric of a released page")
	if !e.info.Fabric {
		_, err = e.d.Create(e.dev, e.gran, vmm.HandleFabric)
		requireIs(t, err, vmm.ErrNotSupported, "Create with HandleFabric on a device without fabric handles")
		_, err = e.d.ImportFabric(vmm.FabricHandle{1})
		requireIs(t, err, vmm.ErrNotSupported, "ImportFabric on a device without fabric handles")
		h := e.create(e.gran, vmm.HandleNone)
		_, err = e.d.ExportFabric(h)
		require.Error(t, err, "ExportFabric of a page without HandleFabric")
		require.True(t, isInvalidOrUnsupported(err), "ExportFabric of a page without HandleFabric: %v", err)
		return
	}
	h, err := e.d.Create(e.dev, e.gran, vmm.HandleFabric)
	if errors.Is(err, vmm.ErrNotSupported) {
		// The device has fabric handles, but this system cannot make them
		// (on CUDA: no IMEX channel).
		t.Skipf("%s: device %d reports fabric handles, but: %v", c.Name, e.dev, err)
	}
	require.NoError(t, err, "Create with HandleFabric")
	e.releaseLater(h)
	fh, err := e.d.ExportFabric(h)
	require.NoError(t, err, "ExportFabric")
	require.NotEqual(t, vmm.FabricHandle{}, fh, "ExportFabric returned a zero handle")
	imp, err := e.d.ImportFabric(fh)
	require.NoError(t, err, "ImportFabric")
	e.releaseLater(imp)
	p := e.reserve(e.gran)
	q := e.reserve(e.gran)
	e.mapRW(p, e.gran, h, 0)
	e.mapRW(q, e.gran, imp, 0)
	data := pattern(int(e.gran), 8)
	e.write(p, data)
	require.True(t, bytes.Equal(data, e.read(q, len(data))), "bytes through the fabric import")
	plain := e.create(e.gran, vmm.HandleNone)
	_, err = e.d.ExportFabric(plain)
	require.True(t, isInvalidOrUnsupported(err), "ExportFabric of a page without HandleFabric: %v", err)
}
