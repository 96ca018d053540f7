package core_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestWarmFreeThatCoalescesMovesShape: a warm Alloc trusts a parked
// block seen isolated at the Heap's current shape without looking at its
// neighbours again, so a warm Free that coalesces (the exact-size lists
// are full) must move the shape on. Here block a is seen isolated, parked
// again, and then its neighbour b is freed into the best-fit tree by a
// warm Free; the next Alloc of a's size must not trust the old look. The
// invariants build checks every trusted look (popExact) and panics on a
// stale one; without it the test still checks what the allocator hands
// out.
func TestWarmFreeThatCoalescesMovesShape(t *testing.T) {
	a, err := expandable.New(vmmtest.HostDriver(t, 8<<30), 0, core.DefaultConfig(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	alloc := func(n uint64) vmm.DevicePtr {
		p, err := a.Alloc(n, 0)
		require.NoError(t, err)
		return p
	}
	pa, pb, pc := alloc(3*mib), alloc(5*mib), alloc(7*mib)
	require.Equal(t, pa.Add(3*mib), pb, "a and b are neighbours")
	fill := make([]vmm.DevicePtr, core.MaxExact-1)
	for i := range fill {
		fill[i] = alloc(512)
	}
	require.NoError(t, a.Free(pa)) // parked
	for _, p := range fill {
		require.NoError(t, a.Free(p)) // parked: the lists are now full
	}
	require.Equal(t, pa, alloc(3*mib), "a taken back from its list, seen isolated")
	require.NoError(t, a.Free(pa)) // parked again
	require.NoError(t, a.Free(pb)) // the lists are full: b is coalesced
	p := alloc(3 * mib)            // a is no longer isolated
	require.Equal(t, pa, p, "best fit carves a's size from the start of a and b merged")
	st := a.Stats()
	require.Equal(t, int64(10*mib), st.AllocatedBytes.All.Current)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(pc))
}
