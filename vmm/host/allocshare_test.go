//go:build linux

package host_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// TestExportAllocFDStaysSparse: moving an allocation into a memfd copies
// only the chunks that hold data, and the allocation's fd lives until
// MemFree.
func TestExportAllocFDStaysSparse(t *testing.T) {
	d := open(t, host.Options{})
	fds := fdCount(t)
	const size = 64 << 20
	p, err := d.MemAlloc(0, size)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(p.Add(40<<20), []byte("one"))) // one chunk of data
	fd, fsize, err := d.ExportAllocFD(p)
	require.NoError(t, err)
	require.EqualValues(t, size, fsize)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	require.EqualValues(t, size, st.Size)
	require.Less(t, st.Blocks*512, int64(1<<20), "only the chunk with data takes memory in the file")
	buf := make([]byte, 3)
	_, err = unix.Pread(fd, buf, 40<<20)
	require.NoError(t, err)
	require.Equal(t, "one", string(buf), "the file holds the allocation's bytes")
	require.NoError(t, unix.Close(fd))
	require.Equal(t, fds+1, fdCount(t), "the driver keeps one memfd for the shared allocation")
	require.NoError(t, d.MemFree(p))
	require.Equal(t, fds, fdCount(t), "MemFree closes it")
	_, _, err = d.ExportAllocFD(p)
	require.ErrorIs(t, err, vmm.ErrInvalid, "a freed allocation")
}

// TestExportAllocFDAfterClose: Close closes the memfds of shared
// allocations; the allocation stays mapped and readable through the
// memory itself, and the driver answers ErrClosed.
func TestExportAllocFDAfterClose(t *testing.T) {
	d, err := host.Open(host.Options{})
	require.NoError(t, err)
	fds := fdCount(t)
	p, err := d.MemAlloc(0, gran)
	require.NoError(t, err)
	fd, _, err := d.ExportAllocFD(p)
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	require.NoError(t, d.Close())
	require.Less(t, fdCount(t), fds, "the arena and the allocation's memfd are closed")
	_, _, err = d.ExportAllocFD(p)
	require.ErrorIs(t, err, vmm.ErrClosed)
}

func TestAllocIPCNotSupported(t *testing.T) {
	d := open(t, host.Options{})
	var drv vmm.Driver = d
	_, isIPC := drv.(vmm.AllocIPC)
	require.False(t, isIPC, "the host backend has no CUDA IPC")
	_, err := vmm.AllocIPCOf(d)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.ErrorContains(t, err, "host backend")
	_, err = vmm.AllocFDOf(d)
	require.NoError(t, err, "the host backend shares plain allocations as files")
}
