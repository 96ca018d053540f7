package fallback

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// The expandable allocator's page policy (recycle_pages, size_classes,
// pack_long_lived, chunk_mb, chunk_min_mb) does not apply to plain allocations: it is
// ignored, so that XSEG_CONF=size_classes:1 does not break Open where auto
// picks fallback. size_classes:1 failed with "size_classes needs
// recycle_pages" although recycling was never turned off.
func TestNewIgnoresExpandablePolicy(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	for _, conf := range []string{"size_classes:1", "chunk_mb:64,chunk_min_mb:8", "recycle_pages:0", "recycle_pages:1,size_classes:1", "pack_long_lived:1", "pack_long_lived:1,settle_chains:1", ""} {
		cfg, err := spec.ParseConfig(spec.DefaultConfig(), conf)
		require.NoError(t, err, conf)
		a, err := New(d, 0, cfg, nil)
		require.NoError(t, err, conf)
		got := a.Config()
		require.False(t, got.RecyclePages, conf)
		require.False(t, got.SizeClasses, conf)
		require.False(t, got.PackLongLived, conf)
		require.False(t, got.SettleChains, conf)
		require.Zero(t, got.ChunkBytes, conf)
		require.Zero(t, got.ChunkMinBytes, conf)
		c := core.ClassicConfig()
		require.Equal(t, []uint64{c.SmallPageSize, c.LargePageSize, c.SmallLimit},
			[]uint64{got.SmallPageSize, got.LargePageSize, got.SmallLimit}, "%q: the defaults' layout is PyTorch's", conf)
		require.NoError(t, a.Close())
	}
}

// Page size keys set under the default configuration (RecyclePages on)
// are honoured: they were replaced by the classic layout whenever
// RecyclePages was on.
func TestNewHonoursPageKeys(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg, err := spec.ParseConfig(spec.DefaultConfig(), "large_page_mb:64,small_page_mb:4,small_limit_kb:512")
	require.NoError(t, err)
	a := newAlloc(t, d, cfg)
	got := a.Config()
	require.Equal(t, []uint64{4 * mib, 64 * mib, 512 << 10}, []uint64{got.SmallPageSize, got.LargePageSize, got.SmallLimit})
	p, err := a.Alloc(5*mib, 0)
	require.NoError(t, err)
	q, err := a.Alloc(1*mib, 0)
	require.NoError(t, err)
	require.Equal(t, []uint64{64 * mib}, segmentSizes(a), "large_page_mb:64: a 5 MiB and a 1 MiB request share one 64 MiB segment")
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))

	cfg, err = spec.ParseConfig(spec.DefaultConfig(), "large_page_mb:64")
	require.NoError(t, err)
	b := newAlloc(t, d, cfg)
	require.Equal(t, uint64(64*mib), b.Config().LargePageSize)
	require.Equal(t, uint64(mib), b.Config().SmallLimit, "small_limit_kb not set: the classic small pool")
	require.Equal(t, uint64(64*mib), SegmentSize(cfg, 5*mib))
	require.Equal(t, uint64(20*mib), SegmentSize(spec.DefaultConfig(), 5*mib), "SegmentSize reads cfg as New does")
}

// A bad configuration is vmm.ErrInvalid once: core.NewHeap added it to
// errors that already had it ("invalid argument: invalid argument").
func TestNewConfigErrorSaysInvalidOnce(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg := DefaultConfig()
	cfg.LargePageSize = 2 << 40
	_, err := New(d, 0, cfg, nil)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "fallback: config: large_page_mb: a page of 2199023255552 bytes is larger than 1 TiB")
	require.Equal(t, 1, strings.Count(err.Error(), vmm.ErrInvalid.Error()), err.Error())

	cfg = DefaultConfig()
	cfg.OOMSizeFactor = 2 // an error of Validate without vmm.ErrInvalid gets it
	_, err = New(d, 0, cfg, nil)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Equal(t, 1, strings.Count(err.Error(), vmm.ErrInvalid.Error()), err.Error())
}
