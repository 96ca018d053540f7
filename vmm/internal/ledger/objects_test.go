package ledger

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// TestIPCOpens: allocations opened through IPC are counted apart from
// MemAlloc's, copies find both, and neither can be given back the other
// way.
func TestIPCOpens(t *testing.T) {
	l := New(2 << 20)
	l.AddAlloc(0x1000000, 4096)
	require.NoError(t, l.AddIPCOpen(0x2000000, 20<<20))
	require.ErrorIs(t, l.AddIPCOpen(0x2000000, 20<<20), vmm.ErrInUse, "an address already open")
	require.ErrorIs(t, l.AddIPCOpen(0x1000000, 4096), vmm.ErrInUse, "an address of a MemAlloc allocation")
	require.ErrorIs(t, l.AddIPCOpen(0x3000000, 0), vmm.ErrInvalid, "empty")
	require.ErrorIs(t, l.AddIPCOpen(0x3000000, ^uint64(0)), vmm.ErrInvalid, "wraps around")
	u := l.Usage()
	require.Equal(t, 1, u.Allocs)
	require.EqualValues(t, 4096, u.AllocBytes)
	require.Equal(t, 1, u.IPCOpens)
	require.EqualValues(t, 20<<20, u.IPCOpenBytes)
	require.Contains(t, u.String(), "ipc-opens=1 (20971520 B)")

	base, size, ok := l.AllocAt(0x2000000 + 5<<20)
	require.True(t, ok)
	require.EqualValues(t, 0x2000000, base)
	require.EqualValues(t, 20<<20, size, "the opened size")
	_, err := l.Alloc("exporting", 0x2000000)
	require.ErrorIs(t, err, vmm.ErrInvalid, "an opened allocation is not re-exported")
	_, err = l.Alloc("exporting", 0x1000000+512)
	require.ErrorIs(t, err, vmm.ErrInvalid, "not the start")
	n, err := l.Alloc("exporting", 0x1000000)
	require.NoError(t, err)
	require.EqualValues(t, 4096, n)

	_, err = l.BeginFreeAlloc(0x2000000)
	require.ErrorContains(t, err, "close it with CloseAllocIPC")
	_, err = l.BeginCloseIPC(0x1000000)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	size, err = l.BeginCloseIPC(0x2000000)
	require.NoError(t, err)
	require.EqualValues(t, 20<<20, size)
	require.Zero(t, l.Usage().IPCOpens)
	l.UndoCloseIPC(0x2000000, size)
	require.Equal(t, 1, l.Usage().IPCOpens)
	_, err = l.BeginCloseIPC(0x2000000)
	require.NoError(t, err)
	_, err = l.BeginFreeAlloc(0x1000000)
	require.NoError(t, err)
	require.True(t, l.Usage().Zero())
}
