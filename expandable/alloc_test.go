package expandable

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

func TestBadInput(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, ClassicConfig())
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	before := a.Stats()

	_, err = a.Alloc(0, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = a.Alloc(2<<30, 0)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.ErrorContains(t, err, "0 retries")
	require.ErrorIs(t, a.Free(p+512), vmm.ErrInvalid, "interior pointer")
	require.ErrorIs(t, a.Free(12345), vmm.ErrInvalid, "unknown pointer")
	require.ErrorIs(t, a.RecordStream(12345, 0), vmm.ErrInvalid)
	_, _, err = a.AllocAtMost(10, 20, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	after := a.Stats()
	require.Equal(t, before.AllocatedBytes, after.AllocatedBytes)
	require.Zero(t, after.NumAllocRetries, "a size beyond the device is refused at once")
	require.NoError(t, a.Free(p))
	require.ErrorIs(t, a.Free(p), vmm.ErrInvalid, "double free")
	require.ErrorIs(t, a.RecordStream(p, 0), vmm.ErrInvalid, "record on a freed block")

	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close is idempotent")
	_, err = a.Alloc(1, 0)
	require.ErrorIs(t, err, vmm.ErrClosed)
	require.ErrorIs(t, a.Free(p), vmm.ErrClosed)
	require.ErrorIs(t, a.EmptyCache(), vmm.ErrClosed)
}

func TestNewChecksPageSizes(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg := ClassicConfig()
	cfg.LargePageSize = 3 << 20
	_, err := New(d, 0, cfg, nil)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "large_page_mb")
}

func TestRoundingSplitAndReuse(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), ClassicConfig())
	p, err := a.Alloc(1, 0)
	require.NoError(t, err)
	q, err := a.Alloc(700, 0)
	require.NoError(t, err)
	require.Equal(t, p+512, q, "blocks are 512-byte multiples, split from one page")
	st := a.Stats()
	require.Equal(t, int64(512+1024), st.AllocatedBytes.Small.Current)
	require.Equal(t, int64(701), st.RequestedBytes.Small.Current)
	require.Equal(t, int64(2<<20), st.ReservedBytes.Small.Current)
	require.NoError(t, a.Free(p))
	r, err := a.Alloc(300, 0)
	require.NoError(t, err)
	require.Equal(t, p, r, "the freed block is reused")
	big, err := a.Alloc(50<<20, 0)
	require.NoError(t, err)
	st = a.Stats()
	require.Equal(t, int64(60<<20), st.ReservedBytes.Large.Current, "three 20 MiB pages")
	require.Equal(t, int64(3), st.Maps-1)
	require.Equal(t, int64(2), st.SetAccessCalls, "one set-access call per run")
	require.NoError(t, a.Free(big))
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Free(r))
}

// gated wraps a driver so that events do not complete until open is set.
type gated struct {
	vmm.Driver
	open  atomic.Bool
	syncs atomic.Int64
}

func (g *gated) EventQuery(e vmm.Event) (bool, error) {
	done, err := g.Driver.EventQuery(e)
	return done && g.open.Load(), err
}

func (g *gated) EventSynchronize(e vmm.Event) error {
	g.syncs.Add(1)
	return g.Driver.EventSynchronize(e)
}

func TestStreamOrderedReuse(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	g := &gated{Driver: d}
	a := newAlloc(t, g, ClassicConfig())
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	defer func() {
		require.NoError(t, a.Close())
		require.NoError(t, d.StreamDestroy(s))
	}()

	p, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.RecordStream(p, s), "recording twice is harmless")
	require.NoError(t, a.RecordStream(p, 0), "the block's own stream is not recorded")
	require.NoError(t, a.Free(p))
	st := a.Stats()
	require.Zero(t, st.AllocatedBytes.All.Current)
	require.Equal(t, int64(1<<20), st.ActiveBytes.All.Current, "pending blocks stay active")
	require.ErrorIs(t, a.Free(p), vmm.ErrInvalid, "a pending block cannot be freed again")

	q, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.NotEqual(t, p, q, "the block is parked while its event is pending")

	g.open.Store(true)
	r, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.Equal(t, p, r, "once the event completed, the block is reused")
	require.Zero(t, g.syncs.Load())
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Free(r))
}

func TestEmptyCacheWaitsForPendingBlocks(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	g := &gated{Driver: d}
	a := newAlloc(t, g, ClassicConfig())
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	defer func() {
		require.NoError(t, a.Close())
		require.NoError(t, d.StreamDestroy(s))
	}()
	p, err := a.Alloc(30<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.RecordStream(p, s))
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	require.Equal(t, int64(1), g.syncs.Load(), "the pending event was waited for")
	st := a.Stats()
	require.Zero(t, st.ReservedBytes.All.Current)
	require.Zero(t, st.ActiveBytes.All.Current)
	u := d.Usage()
	u.Streams--
	require.True(t, u.Zero(), "left %v besides the test's stream", d.Usage())
}

func TestPageCacheReuse(t *testing.T) {
	cfg := ClassicConfig()
	cfg.ReleaseThreshold = 1 // unmap every free page at once
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
	p, err := a.Alloc(40<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	st := a.Stats()
	require.Equal(t, int64(2), st.Unmaps)
	require.Equal(t, int64(40<<20), st.ReservedBytes.All.Current, "cached pages stay reserved")
	p, err = a.Alloc(40<<20, 0)
	require.NoError(t, err)
	st = a.Stats()
	require.Equal(t, int64(2), st.PagesCreated)
	require.Equal(t, int64(2), st.PagesReused)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
}

func TestReleaseThreshold(t *testing.T) {
	cfg := ClassicConfig()
	cfg.ReleaseThreshold = 50 << 20
	cfg.PageCacheBytes = 0
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
	keep, err := a.Alloc(1<<20+512, 0)
	require.NoError(t, err)
	p, err := a.Alloc(200<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	st := a.Stats()
	free := st.ReservedBytes.All.Current - st.ActiveBytes.All.Current
	require.LessOrEqual(t, free, int64(cfg.ReleaseThreshold), "free mapped bytes fall under the threshold")
	require.Positive(t, st.Unmaps)
	require.NoError(t, a.Free(keep))
}

func TestSnapshot(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), ClassicConfig())
	p, err := a.Alloc(3<<20, 0)
	require.NoError(t, err)
	snap := a.Snapshot()
	require.Len(t, snap.Segments, 1)
	seg := snap.Segments[0]
	require.Equal(t, "large", seg.Pool)
	require.Equal(t, []core.Range{{Ptr: seg.Base, Size: 20 << 20}}, seg.Mapped)
	require.Equal(t, core.Block{Ptr: p, Size: 3 << 20, Requested: 3 << 20, State: core.BlockAllocated}, seg.Blocks[0])
	require.Equal(t, core.BlockFree, seg.Blocks[1].State)
	require.NoError(t, a.Free(p))
}
