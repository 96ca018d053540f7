package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// orderDriver logs the stream waits and unmaps it forwards, in order.
type orderDriver struct {
	vmm.Driver
	log []string
}

func (d *orderDriver) StreamSynchronize(s vmm.Stream) error {
	if s == 0 {
		d.log = append(d.log, "sync 0")
	} else {
		d.log = append(d.log, "sync other")
	}
	return d.Driver.StreamSynchronize(s)
}

func (d *orderDriver) Unmap(ptr vmm.DevicePtr, size uint64) error {
	d.log = append(d.log, "unmap")
	return d.Driver.Unmap(ptr, size)
}

func recycleConfig(recycle bool) Config {
	cfg := ClassicConfig()
	cfg.SmallLimit = 0
	cfg.LargePageSize = 2 * mib
	cfg.PageCacheBytes = 0
	cfg.RecyclePages = recycle
	return cfg
}

// TestRecyclePagesBeyondCache: with no page cache, a growth past a freed
// block that it does not fit in unmaps exactly the pages it lacks there
// and maps them where it grows (reserved stays at what is live); without
// recycle_pages the growth creates new pages and the freed ones stay
// mapped.
func TestRecyclePagesBeyondCache(t *testing.T) {
	for _, recycle := range []bool{false, true} {
		a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), recycleConfig(recycle))
		freed, err := a.Alloc(40*mib, 0)
		require.NoError(t, err)
		fence, err := a.Alloc(2*mib, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(freed))
		grown, err := a.Alloc(60*mib, 0) // does not fit the 40 MiB
		require.NoError(t, err)
		st := a.Stats()
		if !recycle {
			require.Equal(t, int64(102*mib), st.ReservedBytes.All.Peak)
			require.Zero(t, st.Unmaps)
			continue
		}
		require.Equal(t, int64(62*mib), st.ReservedBytes.All.Peak, "the freed pages moved: reserved is what is live")
		require.Equal(t, int64(20), st.Unmaps+st.PagesRetired, "all 20 freed pages recycled")
		require.Equal(t, int64(20), st.PagesReused)
		require.Equal(t, int64(1+20+10), st.PagesCreated, "only the pages the freed ones did not cover are new")
		require.Zero(t, st.ReservedBytes.All.Current-st.ActiveBytes.All.Current, "nothing cached after the growth")
		require.NoError(t, a.Free(grown))
		require.NoError(t, a.Free(fence))
	}
}

// TestRecyclePagesExact: a growth that needs fewer pages than a free
// block holds unmaps only those, and leaves the rest of the block mapped
// and usable without new pages.
func TestRecyclePagesExact(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), recycleConfig(true))
	freed, err := a.Alloc(40*mib, 0)
	require.NoError(t, err)
	fence, err := a.Alloc(2*mib, 0)
	require.NoError(t, err)
	tail, err := a.Alloc(10*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(freed))
	require.NoError(t, a.Free(tail)) // the free block before the end: 10 MiB
	grown, err := a.Alloc(44*mib, 0) // fits nowhere: grows 34 MiB past the tail
	require.NoError(t, err)
	st := a.Stats()
	require.Equal(t, int64(17), st.Unmaps+st.PagesRetired, "the 17 pages the growth lacks, not the 20 freed")
	require.Equal(t, int64(17), st.PagesReused)
	require.Equal(t, int64(52*mib), st.ReservedBytes.All.Peak)
	created := st.PagesCreated
	rest, err := a.Alloc(6*mib, 0) // the rest of the freed block, still mapped
	require.NoError(t, err)
	require.Equal(t, created, a.Stats().PagesCreated)
	for _, p := range []vmm.DevicePtr{rest, grown, fence} {
		require.NoError(t, a.Free(p))
	}
}

// TestRecyclePagesAcrossStreams: a growth on one stream takes the free
// pages of another stream's range once that stream's work is done: the
// other stream is waited for before the first unmap.
func TestRecyclePagesAcrossStreams(t *testing.T) {
	for _, recycle := range []bool{false, true} {
		d := &orderDriver{Driver: vmmtest.HostDriver(t, 1<<30)}
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		a := newAlloc(t, d, recycleConfig(recycle))
		side, err := a.Alloc(40*mib, s)
		require.NoError(t, err)
		require.NoError(t, a.Free(side))
		d.log = nil
		p, err := a.Alloc(40*mib, 0)
		require.NoError(t, err)
		st := a.Stats()
		if !recycle {
			require.Equal(t, int64(80*mib), st.ReservedBytes.All.Peak)
			require.NotContains(t, d.log, "unmap")
		} else {
			require.Equal(t, int64(40*mib), st.ReservedBytes.All.Peak, "the side stream's pages moved")
			require.Equal(t, int64(20), st.PagesReused)
			require.Equal(t, "sync other", d.log[0], "the side stream is waited for before its pages are unmapped: %v", d.log)
			require.Contains(t, d.log, "unmap")
		}
		require.NoError(t, a.Free(p))
		require.NoError(t, a.Close())
		require.NoError(t, d.StreamDestroy(s))
	}
}
