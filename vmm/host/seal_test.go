//go:build linux

package host_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// TestExportedPageCannotBeTruncated guards issue 15 item 1: whoever holds
// an exported page's fd (an importer) cannot truncate it, so the
// exporter's copies from its own mapping keep working instead of dying of
// SIGBUS. (The cross-process case is ipc's TestImporterCannotTruncate.)
func TestExportedPageCannotBeTruncated(t *testing.T) {
	d := open(t, host.Options{})
	ptr, h := rwPages(t, d, 2, vmm.HandlePosixFD)
	data := fill(int(2*gran), 7)
	require.NoError(t, d.CopyHtoD(ptr, data))
	fd, err := d.ExportFD(h)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.ErrorIs(t, unix.Ftruncate(fd, 0), unix.EPERM, "shrinking a shared page")
	require.ErrorIs(t, unix.Ftruncate(fd, int64(4*gran)), unix.EPERM, "growing a shared page")
	_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE)
	require.ErrorIs(t, err, unix.EPERM, "the seals are sealed: nobody can forbid the exporter's writes")
	got := make([]byte, len(data))
	require.NoError(t, d.CopyDtoH(got, ptr), "the exporter's copy still works")
	require.Equal(t, data, got)
}

// TestExportedAllocCannotBeTruncated is the same for a plain allocation
// moved into a memfd by ExportAllocFD.
func TestExportedAllocCannotBeTruncated(t *testing.T) {
	d := open(t, host.Options{})
	p, err := d.MemAlloc(0, 3*gran)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.MemFree(p)) }()
	data := fill(int(3*gran), 9)
	require.NoError(t, d.CopyHtoD(p, data))
	fd, _, err := d.ExportAllocFD(p)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.ErrorIs(t, unix.Ftruncate(fd, 0), unix.EPERM)
	got := make([]byte, len(data))
	require.NoError(t, d.CopyDtoH(got, p))
	require.Equal(t, data, got)
}

// TestImportRefusesUnsealedFile: an fd whose size its holders can change
// (a forged or foreign memfd, a plain tmpfs file) is not mapped.
func TestImportRefusesUnsealedFile(t *testing.T) {
	d := open(t, host.Options{})
	mfd, err := unix.MemfdCreate("foreign", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(mfd)
	require.NoError(t, unix.Ftruncate(mfd, int64(gran)))
	_, err = d.ImportFD(mfd)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "not sealed")

	sfd, err := unix.MemfdCreate("half-sealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	defer unix.Close(sfd)
	require.NoError(t, unix.Ftruncate(sfd, int64(gran)))
	_, err = unix.FcntlInt(uintptr(sfd), unix.F_ADD_SEALS, unix.F_SEAL_GROW)
	require.NoError(t, err)
	_, err = d.ImportFD(sfd)
	require.ErrorIs(t, err, vmm.ErrInvalid, "sealed against growing but not shrinking")
	require.True(t, d.Usage().Zero(), "nothing was imported: %v", d.Usage())
}
