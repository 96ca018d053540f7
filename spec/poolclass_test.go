package spec

import (
	"encoding/json"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestPoolClasses: the classes are in matching order, PoolOf sends a
// request to the first class it fits, each class's page size and key come
// from the config, and every pool has a counter of its own under its
// PyTorch name.
func TestPoolClasses(t *testing.T) {
	c := DefaultConfig()
	c.SmallLimit = 512 * KiB
	c.LargePageSize = 40 * MiB
	classes := c.PoolClasses()
	require.Len(t, classes, NumPools)
	for i, pc := range classes {
		require.Equal(t, Pool(i), pc.Pool, "class %d is pool %d", i, i)
		require.Equal(t, pc.PageSize, c.PageSize(pc.Pool))
		require.NotEmpty(t, pc.PageKey)
		_, err := ParseConfig(c, pc.PageKey+":4")
		require.NoError(t, err, "%s is a configuration key", pc.PageKey)
	}
	require.Zero(t, classes[NumPools-1].MaxRequest, "the last class takes the rest")
	require.Equal(t, uint64(40*MiB), c.PageSize(Large))
	require.Equal(t, Small, c.PoolOf(512*KiB))
	require.Equal(t, Large, c.PoolOf(512*KiB+512))
	require.Equal(t, Large, c.PoolOf(1<<40))

	var s PoolStat
	for i, p := range Pools() {
		s.Add(p, int64(i+1)*10)
	}
	require.Equal(t, int64(10), s.Small.Current)
	require.Equal(t, int64(20), s.Large.Current)
	require.Equal(t, int64(30), s.All.Current)
	s.Add(Large, -20)
	s.ResetPeak()
	require.Equal(t, int64(0), s.Large.Peak, "ResetPeak reaches every pool")
	b, err := json.Marshal(s)
	require.NoError(t, err)
	for _, p := range Pools() {
		require.Contains(t, string(b), `"`+p.String()+`_pool"`, "PyTorch's key for %v", p)
	}
}

// TestUnknownPool: a pool outside the classes has no counter and no name
// of a real pool; it panics rather than count as another pool.
func TestUnknownPool(t *testing.T) {
	bad := Pool(NumPools)
	require.Equal(t, "Pool(2)", bad.String())
	require.Equal(t, "Pool(-1)", Pool(-1).String())
	var s PoolStat
	require.Panics(t, func() { s.Add(bad, 1) })
	require.Panics(t, func() { _ = DefaultConfig().PageSize(bad) + 1 })
}

// TestNoSmallPool: small_limit_kb:0 sends every request to the large pool.
func TestNoSmallPool(t *testing.T) {
	c, err := ParseConfig(DefaultConfig(), "small_limit_kb:0,large_page_mb:2")
	require.NoError(t, err)
	require.Zero(t, c.SmallLimit)
	for _, size := range []uint64{1, 512, 4096, 1 * MiB, 1 << 40} {
		require.Equal(t, Large, c.PoolOf(size), "%d bytes", size)
	}
}

// TestPoolStatLayout: PoolStat's per-pool fields are one Stat a pool, in
// Pool order and right after one another, as PoolStat.Of indexes them.
func TestPoolStatLayout(t *testing.T) {
	var s PoolStat
	require.Equal(t, unsafe.Sizeof(Stat{})*uintptr(NumPools+1), unsafe.Sizeof(s), "All and one Stat a pool, nothing else")
	require.Equal(t, unsafe.Offsetof(s.Small), unsafe.Sizeof(Stat{}))
	require.Equal(t, unsafe.Offsetof(s.Large), unsafe.Offsetof(s.Small)+unsafe.Sizeof(Stat{}))
	require.Same(t, &s.Small, s.Of(Small))
	require.Same(t, &s.Large, s.Of(Large))
}

// TestPageMates: pools hand pages only to pools with pages of their size.
func TestPageMates(t *testing.T) {
	c := ClassicConfig()
	require.Empty(t, c.PageMates(Small), "2 MiB and 20 MiB pages do not mix")
	require.Empty(t, c.PageMates(Large))
	c.LargePageSize = c.SmallPageSize
	require.Equal(t, []Pool{Large}, c.PageMates(Small))
	require.Equal(t, []Pool{Small}, c.PageMates(Large))
}
