package vmmtest

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// testAllocShare shares a plain allocation the way the backend offers:
// the fd of a memory file (ExportAllocFD, the host) or a legacy IPC
// handle (ExportAllocIPC, CUDA). Exactly one of the two works; the other
// answers ErrNotSupported.
func testAllocShare(t *testing.T, c Config) {
	e := openAny(t, c)
	size := 3*e.gran/2 + 100 // not a multiple of the granularity
	p := e.memAlloc(size)
	data := pattern(int(size), 11)
	e.write(p, data)
	fd, fsize, fdErr := exportAllocFD(e.d, p)
	if fdErr == nil {
		f := os.NewFile(uintptr(fd), "vmmtest-exported-alloc")
		t.Cleanup(func() { _ = f.Close() })
		e.allocShareFD(p, size, f, fsize, data)
		return
	}
	requireIs(t, fdErr, vmm.ErrNotSupported, "ExportAllocFD where it does not work")
	e.allocShareIPC(p, size, data)
}

// allocShareFD checks an allocation exported as the memory file f: it
// kept its bytes and address, and a mapping of the imported file shares
// bytes with it both ways, also after MemFree.
func (e *env) allocShareFD(p vmm.DevicePtr, size uint64, f *os.File, fsize uint64, data []byte) {
	t := e.t
	require.Equal(t, (size+e.gran-1)/e.gran*e.gran, fsize, "the file is the allocation rounded up to the granularity")
	require.Equal(t, data, e.read(p, len(data)), "the allocation kept its bytes when it moved into the file")
	_, err := exportAllocIPC(e.d, p)
	requireIs(t, err, vmm.ErrNotSupported, "ExportAllocIPC on a backend that exports fds")
	_, _, err = exportAllocFD(e.d, p.Add(512))
	requireIs(t, err, vmm.ErrInvalid, "ExportAllocFD inside an allocation")

	fd2, fsize2, err := exportAllocFD(e.d, p)
	require.NoError(t, err, "a second export")
	f2 := os.NewFile(uintptr(fd2), "second export")
	st1, err := f.Stat()
	require.NoError(t, err)
	st2, err := f2.Stat()
	require.NoError(t, err)
	require.NoError(t, f2.Close())
	require.True(t, os.SameFile(st1, st2), "a second export names the same file")
	require.Equal(t, fsize, fsize2)

	h, err := e.d.ImportFD(int(f.Fd()))
	require.NoError(t, err, "ImportFD of an exported allocation")
	e.releaseLater(h)
	q := e.reserve(fsize)
	e.mapRW(q, fsize, h, 0)
	require.Equal(t, data, e.read(q, len(data)), "the importer's mapping holds the allocation's bytes")
	e.write(q.Add(5), []byte("reply"))
	require.Equal(t, []byte("reply"), e.read(p.Add(5), 5), "written through the importer's mapping")
	e.write(p.Add(e.gran), []byte("again"))
	require.Equal(t, []byte("again"), e.read(q.Add(e.gran), 5), "written through the allocation")
	require.NoError(t, e.d.MemFree(p))
	require.Equal(t, []byte("reply"), e.read(q.Add(5), 5), "the importer's mapping outlives MemFree")
}

// allocShareIPC checks an allocation exported as a legacy IPC handle. The
// exporting process cannot open its own handle on CUDA; whatever the
// driver answers, nothing may stay open.
func (e *env) allocShareIPC(p vmm.DevicePtr, size uint64, data []byte) {
	t := e.t
	h, err := exportAllocIPC(e.d, p)
	require.NoError(t, err, "a backend without ExportAllocFD exports legacy IPC handles")
	require.NotEqual(t, vmm.IPCMemHandle{}, h, "an all-zero handle")
	_, err = exportAllocIPC(e.d, p.Add(512))
	requireIs(t, err, vmm.ErrInvalid, "ExportAllocIPC inside an allocation")
	requireIs(t, closeAllocIPC(e.d, p), vmm.ErrInvalid, "CloseAllocIPC of an allocation made here")
	q, n, err := openAllocIPC(e.d, h, e.dev)
	if err == nil {
		t.Logf("the driver opened its own handle at %v (%d bytes)", q, n)
		require.Equal(t, 1, e.d.Usage().IPCOpens)
		requireIs(t, e.d.MemFree(q), vmm.ErrInvalid, "MemFree of an IPC-opened allocation")
		require.NoError(t, closeAllocIPC(e.d, q))
	} else {
		t.Logf("opening its own handle: %v", err)
		require.False(t, errors.Is(err, vmm.ErrNotSupported), "the backend has legacy IPC: %v", err)
	}
	require.Zero(t, e.d.Usage().IPCOpens, "nothing stays open")
	require.Equal(t, data, e.read(p, int(size)), "the allocation is untouched")
	require.NoError(t, e.d.MemFree(p))
}
