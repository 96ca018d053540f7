package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestGrowthTakesSmallPoolPages: with both pools on pages of one size, a
// large growth takes the whole free pages of the small pool on its stream
// (unmapped there, mapped where the large pool grows) before it creates
// pages; the small pool never takes the large pool's mapped pages; with
// pages of different sizes nothing moves between the pools.
func TestGrowthTakesSmallPoolPages(t *testing.T) {
	cfg := ClassicConfig()
	cfg.LargePageSize = cfg.SmallPageSize
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
	var small []vmm.DevicePtr
	for range 8 { // 8 small blocks of 1 MiB: 4 small pages
		p, err := a.Alloc(1<<20, 0)
		require.NoError(t, err)
		small = append(small, p)
	}
	st := a.Stats()
	smallPages := st.ReservedBytes.Small.Current / (2 * mib)
	require.GreaterOrEqual(t, smallPages, int64(4))
	for _, p := range small {
		require.NoError(t, a.Free(p))
	}
	created := a.Stats().PagesCreated
	size := (smallPages + 2) * 2 * mib
	big, err := a.Alloc(uint64(size), 0)
	require.NoError(t, err)
	st = a.Stats()
	require.Zero(t, st.ReservedBytes.Small.Current, "the small pool's free pages went to the large pool")
	require.Equal(t, size, st.ReservedBytes.Large.Current)
	require.Equal(t, smallPages, st.PagesReused, "every small page recycled")
	require.Equal(t, created+2, st.PagesCreated, "only the rest created")
	require.Equal(t, size, st.ReservedBytes.All.Current, "reserved is what is live")

	require.NoError(t, a.Free(big))
	before := a.Stats()
	s, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	after := a.Stats()
	require.Equal(t, before.ReservedBytes.Large.Current, after.ReservedBytes.Large.Current,
		"a small growth leaves the large pool's mapped pages alone")
	require.Equal(t, int64(2*mib), after.ReservedBytes.Small.Current)
	require.NoError(t, a.Free(s))
}

// TestNoStealAcrossPageSizes: with the default 2 MiB and 20 MiB pages a
// large growth leaves the small pool's free pages mapped.
func TestNoStealAcrossPageSizes(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), ClassicConfig())
	p, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	q, err := a.Alloc(30*mib, 0)
	require.NoError(t, err)
	st := a.Stats()
	require.Equal(t, int64(2*mib), st.ReservedBytes.Small.Current)
	require.Zero(t, st.PagesReused)
	require.NoError(t, a.Free(q))
}

// TestOnePool: with small_limit_kb:0 small and large requests share one
// range, and the pages a freed large block leaves serve small requests
// without new pages.
func TestOnePool(t *testing.T) {
	cfg := ClassicConfig()
	cfg.SmallLimit = 0
	cfg.LargePageSize = 2 * mib
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
	big, err := a.Alloc(8*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(big))
	created := a.Stats().PagesCreated
	var small []vmm.DevicePtr
	for range 16 {
		p, err := a.Alloc(256<<10, 0)
		require.NoError(t, err)
		small = append(small, p)
	}
	st := a.Stats()
	require.Equal(t, created, st.PagesCreated, "the small blocks fit in the freed pages")
	require.Zero(t, st.ReservedBytes.Small.Current)
	require.Equal(t, int64(8*mib), st.ReservedBytes.All.Current)
	for _, p := range small {
		require.NoError(t, a.Free(p))
	}
}
