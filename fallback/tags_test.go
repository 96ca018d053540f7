package fallback

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestTagsWithoutPause: the fallback allocator's tags are named pools with
// their own statistics; pausing needs memory that can be mapped again at
// its address, which plain allocations are not.
func TestTagsWithoutPause(t *testing.T) {
	d := vmmtest.HostDriver(t, 0)
	a := newAlloc(t, d, DefaultConfig())
	id, err := a.Tag("weights")
	require.NoError(t, err)
	require.True(t, id.IsTag())
	p, err := a.AllocInPool(id, 3<<20, 0)
	require.NoError(t, err)
	ts, err := a.TagStats("weights")
	require.NoError(t, err)
	require.Equal(t, uint64(3<<20), ts.AllocatedBytes)
	require.Equal(t, int64(1), ts.Allocations)
	require.NotZero(t, ts.ReservedBytes)
	mem := d.Usage()
	require.ErrorIs(t, a.Pause(true, "weights"), vmm.ErrNotSupported)
	require.ErrorIs(t, a.Resume(), vmm.ErrNotSupported)
	require.Equal(t, mem, d.Usage(), "nothing was touched")
	require.NoError(t, d.Memset(p, 1, 3<<20))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Close())
	require.ErrorIs(t, a.Pause(true, "weights"), vmm.ErrClosed, "after Close, as every other call")
	require.ErrorIs(t, a.Resume(), vmm.ErrClosed)
}
