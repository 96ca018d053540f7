package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// blockStatsOf are the five block statistics, in the order allocated,
// requested and active bytes, allocations, active blocks.
func blockStatsOf(st spec.Stats) [5]spec.PoolStat {
	return [5]spec.PoolStat{st.AllocatedBytes, st.RequestedBytes, st.ActiveBytes, st.Allocations, st.ActiveBlocks}
}

// TestBlockStatsAcrossResets follows the block statistics exactly through
// allocations and frees in both pools around ResetAccumulatedStats and
// ResetPeakStats with blocks live: freed counts only what was freed since
// the reset, all-pools values are the sums of the pools', and the
// snapshot says the same.
func TestBlockStatsAcrossResets(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 0), ClassicConfig())
	const kib, mib = 1 << 10, 1 << 20
	small1, err := a.Alloc(500, 0) // 512 bytes
	require.NoError(t, err)
	large, err := a.Alloc(3*mib, 0)
	require.NoError(t, err)
	a.ResetAccumulatedStats()
	small2, err := a.Alloc(4*kib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(small1))

	st := a.Stats()
	require.Equal(t, st, a.Snapshot().Stats)
	s := func(cur, peak, alloc, freed int64) spec.Stat {
		return spec.Stat{Current: cur, Peak: peak, Allocated: alloc, Freed: freed}
	}
	want := [5]spec.PoolStat{
		{All: s(4*kib+3*mib, 512+3*mib+4*kib, 4*kib, 512), Small: s(4*kib, 512+4*kib, 4*kib, 512), Large: s(3*mib, 3*mib, 0, 0)},
		{All: s(4*kib+3*mib, 500+3*mib+4*kib, 4*kib, 500), Small: s(4*kib, 500+4*kib, 4*kib, 500), Large: s(3*mib, 3*mib, 0, 0)},
		{All: s(4*kib+3*mib, 512+3*mib+4*kib, 4*kib, 512), Small: s(4*kib, 512+4*kib, 4*kib, 512), Large: s(3*mib, 3*mib, 0, 0)},
		{All: s(2, 3, 1, 1), Small: s(1, 2, 1, 1), Large: s(1, 1, 0, 0)},
		{All: s(2, 3, 1, 1), Small: s(1, 2, 1, 1), Large: s(1, 1, 0, 0)},
	}
	require.Equal(t, want, blockStatsOf(st))

	a.ResetPeakStats()
	a.ResetAccumulatedStats()
	require.NoError(t, a.Free(large))
	require.NoError(t, a.Free(small2))
	st = a.Stats()
	want = [5]spec.PoolStat{
		{All: s(0, 4*kib+3*mib, 0, 4*kib+3*mib), Small: s(0, 4*kib, 0, 4*kib), Large: s(0, 3*mib, 0, 3*mib)},
		{All: s(0, 4*kib+3*mib, 0, 4*kib+3*mib), Small: s(0, 4*kib, 0, 4*kib), Large: s(0, 3*mib, 0, 3*mib)},
		{All: s(0, 4*kib+3*mib, 0, 4*kib+3*mib), Small: s(0, 4*kib, 0, 4*kib), Large: s(0, 3*mib, 0, 3*mib)},
		{All: s(0, 2, 0, 2), Small: s(0, 1, 0, 1), Large: s(0, 1, 0, 1)},
		{All: s(0, 2, 0, 2), Small: s(0, 1, 0, 1), Large: s(0, 1, 0, 1)},
	}
	require.Equal(t, want, blockStatsOf(st))
	require.Equal(t, st, a.Snapshot().Stats)
}

// TestFreeRefusalsWithFullCache fills every slot of the cache of handed-out
// blocks Free looks in first (more blocks than slots, of sizes in both
// pools) and checks that Free still refuses interior pointers and double
// frees without changing anything, and frees each block once.
func TestFreeRefusalsWithFullCache(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 0), ClassicConfig())
	var ptrs []vmm.DevicePtr
	for i := range 600 {
		p, err := a.Alloc(uint64(512+(i%7)*512+(i%3)*(1<<20)), 0)
		require.NoError(t, err)
		ptrs = append(ptrs, p)
	}
	before := a.Stats()
	for _, p := range ptrs {
		// p+256 falls in p's slot of the cache: Free must see it is
		// not p.
		require.ErrorIs(t, a.Free(p.Add(256)), vmm.ErrInvalid, "interior pointer %v", p.Add(256))
	}
	require.Equal(t, before, a.Stats(), "refused frees changed the stats")
	for i, p := range ptrs {
		if i%2 == 0 {
			require.NoError(t, a.Free(p))
		}
	}
	for i, p := range ptrs {
		if i%2 == 0 {
			require.ErrorIs(t, a.Free(p), vmm.ErrInvalid, "double free of %v", p)
		} else {
			require.NoError(t, a.Free(p))
		}
	}
	st := a.Stats()
	require.Zero(t, st.AllocatedBytes.All.Current)
	require.Zero(t, st.ActiveBlocks.All.Current)
	require.Equal(t, int64(len(ptrs)), st.Allocations.All.Freed)
}
