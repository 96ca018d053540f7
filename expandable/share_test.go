package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

func TestPinBlockNeedsShareable(t *testing.T) {
	d := vmmtest.HostDriver(t, 0)
	a := newAlloc(t, d, ClassicConfig())
	p, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	_, err = a.PinBlock(p)
	require.ErrorIs(t, err, ErrNotShareable)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.ErrorContains(t, err, "shareable:true")
	require.NoError(t, a.Free(p))
}

// TestPinnedBlockOutlivesFree: a freed pinned block is not reused, its
// pages survive EmptyCache, and the last unpin makes it free.
func TestPinnedBlockOutlivesFree(t *testing.T) {
	d := vmmtest.HostDriver(t, 0)
	cfg := ClassicConfig()
	cfg.Shareable = true
	a := newAlloc(t, d, cfg)
	lo, err := a.Alloc(3<<20, 0) // large pool: the next block starts inside a page
	require.NoError(t, err)
	const size = 30 << 20
	p, err := a.Alloc(size, 0)
	require.NoError(t, err)

	_, err = a.PinBlock(p + 512)
	require.ErrorIs(t, err, vmm.ErrInvalid, "an interior pointer is no block")
	pin, err := a.PinBlock(p)
	require.NoError(t, err)
	pin2, err := a.PinBlock(p)
	require.NoError(t, err)
	ps := cfg.LargePageSize
	require.Equal(t, ps, pin.PageSize)
	require.EqualValues(t, size, pin.Length)
	require.Len(t, pin.Pages, int((pin.Offset+size+ps-1)/ps))
	require.Equal(t, 1, a.Pinned())

	require.NoError(t, a.Free(p))
	require.ErrorIs(t, a.Free(p), vmm.ErrInvalid, "freed once is freed")
	st := a.Stats()
	require.EqualValues(t, 3<<20, st.AllocatedBytes.All.Current, "a freed pinned block is not allocated")
	require.EqualValues(t, 3<<20+size, st.ActiveBytes.All.Current, "but still active")
	require.NoError(t, a.EmptyCache())
	require.GreaterOrEqual(t, uint64(a.Stats().ReservedBytes.All.Current), uint64(size), "EmptyCache keeps pinned pages")
	q, err := a.Alloc(size, 0)
	require.NoError(t, err)
	require.True(t, q.Add(size) <= p || p.Add(size) <= q, "the pinned range is not reused")
	require.NoError(t, a.Free(q))

	require.NoError(t, pin.Unpin())
	require.NoError(t, pin.Unpin(), "a second call does nothing")
	require.Equal(t, 1, a.Pinned(), "another pin holds it")
	require.NoError(t, pin2.Unpin())
	require.Zero(t, a.Pinned())
	require.NoError(t, a.Free(lo))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current, "once unpinned everything can be given back")
}
