package fallback

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestPinBlock: a pin names the block's segment and its place in it; a
// freed pinned block is not reused and keeps its segment through
// EmptyCache; the last unpin frees it.
func TestPinBlock(t *testing.T) {
	d := vmmtest.HostDriver(t, 0)
	a := newAlloc(t, d, DefaultConfig())
	pre, err := a.Alloc(3<<20, 0)
	require.NoError(t, err)
	const size = 6<<20 + 100
	p, err := a.Alloc(size, 0)
	require.NoError(t, err)

	_, err = a.PinBlock(p + 512)
	require.ErrorIs(t, err, vmm.ErrInvalid, "an interior pointer is no block")
	pin, err := a.PinBlock(p)
	require.NoError(t, err)
	require.Equal(t, pre, pin.Alloc, "the segment starts with pre")
	require.EqualValues(t, 20<<20, pin.PageSize, "the whole segment is the page")
	require.Empty(t, pin.Pages)
	require.EqualValues(t, p-pre, pin.Offset)
	require.EqualValues(t, size, pin.Length)
	require.Equal(t, 1, a.Pinned())

	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(pre))
	require.NoError(t, a.EmptyCache())
	require.EqualValues(t, 20<<20, a.Stats().ReservedBytes.All.Current, "the pinned block's segment is kept")
	q, err := a.Alloc(size, 0)
	require.NoError(t, err)
	require.True(t, q.Add(size) <= p || p.Add(size) <= q, "the pinned block is not reused")
	require.NoError(t, a.Free(q))

	require.NoError(t, pin.Unpin())
	require.Zero(t, a.Pinned())
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current, "unpinned, the segment goes back")
}
