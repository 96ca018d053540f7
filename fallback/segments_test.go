package fallback

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

const mib = 1 << 20

func TestSegmentSize(t *testing.T) {
	cfg := DefaultConfig()
	for _, c := range []struct{ req, want uint64 }{
		{1, 2 * mib},
		{512 << 10, 2 * mib},
		{1 * mib, 2 * mib},
		{1*mib + 1, 20 * mib},
		{10*mib - 512, 20 * mib},
		{10 * mib, 10 * mib},
		{21*mib + 5, 22 * mib},
		{64 * mib, 64 * mib},
	} {
		require.Equal(t, c.want, SegmentSize(cfg, c.req), "request of %d bytes", c.req)
	}
	cfg.LargePageSize, cfg.SmallPageSize, cfg.SmallLimit = 40*mib, 4*mib, 2*mib
	require.Equal(t, uint64(4*mib), SegmentSize(cfg, 2*mib))
	require.Equal(t, uint64(40*mib), SegmentSize(cfg, 19*mib), "below half the large segment size")
	require.Equal(t, uint64(24*mib), SegmentSize(cfg, 21*mib), "rounded up to the small segment size")
}

// TestSegmentsAsPyTorch checks the segments made for a mix of requests:
// small requests share a 2 MiB segment, 1 to 10 MiB requests a 20 MiB
// one, and a larger request gets its own segment, each one allocation.
func TestSegmentsAsPyTorch(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, DefaultConfig())
	var small []vmm.DevicePtr
	for range 4 {
		p, err := a.Alloc(100_000, 0)
		require.NoError(t, err)
		small = append(small, p)
	}
	for i := 1; i < len(small); i++ {
		require.Equal(t, small[i-1].Add(core.RoundSize(100_000)), small[i], "small blocks are carved in order from one segment")
	}
	require.Equal(t, 1, d.Usage().Allocs)
	m1, err := a.Alloc(3*mib, 0)
	require.NoError(t, err)
	m2, err := a.Alloc(3*mib, 0)
	require.NoError(t, err)
	require.Equal(t, m1.Add(3*mib), m2, "both medium blocks come from one 20 MiB segment")
	big, err := a.Alloc(30*mib+1, 0)
	require.NoError(t, err)
	u := d.Usage()
	require.Equal(t, 3, u.Allocs)
	require.Equal(t, uint64(2*mib+20*mib+32*mib), u.AllocBytes)
	require.ElementsMatch(t, []uint64{2 * mib, 20 * mib, 32 * mib}, segmentSizes(a))

	st := a.Stats()
	require.Equal(t, int64(1), st.Segments.Small.Current)
	require.Equal(t, int64(2), st.Segments.Large.Current)
	require.Equal(t, int64(54*mib), st.ReservedBytes.All.Current)
	require.Equal(t, int64(2*mib), st.ReservedBytes.Small.Current)
	require.Equal(t, int64(3), st.PagesCreated, "one plain allocation a segment")
	for _, p := range append(small, m1, m2, big) {
		require.NoError(t, a.Free(p))
	}
	require.Equal(t, 3, d.Usage().Allocs, "freed segments stay cached")
}

// TestSplitAndMerge: blocks split a segment and merge back when freed, so
// the whole segment serves a request of its size without a new one.
func TestSplitAndMerge(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, DefaultConfig())
	var ps []vmm.DevicePtr
	for range 4 {
		p, err := a.Alloc(5*mib, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	require.Equal(t, 1, d.Usage().Allocs, "four 5 MiB blocks tile one 20 MiB segment")
	require.NoError(t, a.Free(ps[1]))
	again, err := a.Alloc(4*mib, 0)
	require.NoError(t, err)
	require.Equal(t, ps[1], again, "best fit reuses the freed block, split")
	snap := a.Snapshot()
	require.Len(t, snap.Segments, 1)
	require.Len(t, snap.Segments[0].Blocks, 5, "4 MiB allocated + 1 MiB free where the block was")
	require.NoError(t, a.Free(again))
	for _, i := range []int{0, 2, 3} {
		require.NoError(t, a.Free(ps[i]))
	}
	whole, err := a.Alloc(20*mib, 0)
	require.NoError(t, err)
	require.Equal(t, ps[0], whole, "the freed blocks merged back into the whole segment")
	require.Equal(t, 1, d.Usage().Allocs)
	require.NoError(t, a.Free(whole))
}

func TestNewRefusesBadConfig(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg := DefaultConfig()
	cfg.LargePageSize = 1000
	_, err := New(d, 0, cfg, nil)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "large_page_mb")
	cfg = DefaultConfig()
	cfg.SmallLimit = 3 * mib // above the small segment size
	_, err = New(d, 0, cfg, nil)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = New(d, 7, DefaultConfig(), nil)
	require.Error(t, err, "no device 7")
}
