package expandable

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
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

// TestWarmPathsMatch holds the warm paths of Alloc and Free, which write
// out the general path's steps for a block parked in an exact-size list,
// to the general path: two allocators run the same random sequence of
// allocations and frees, one with the warm paths off (core's
// SetWarmPaths), and must hand out the same places and end every stretch
// with the same blocks, pages and statistics. Sizes repeat, so that most
// allocations find a parked block, with jittered ones among them; one in
// five runs on a second stream, and the sequence frees blocks in a random
// order, so that parked blocks lose and regain their free neighbours.
// Under every page policy, several seeds each.
func TestWarmPathsMatch(t *testing.T) {
	withClasses := DefaultConfig()
	withClasses.SizeClasses, withClasses.WholePages = true, true
	for _, p := range []struct {
		name string
		cfg  Config
	}{{"default", DefaultConfig()}, {"classic", ClassicConfig()}, {"steady", SteadyConfig()}, {"classes", withClasses}, {"settle", settleChainsConfig()}} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%s/seed%d", p.name, seed), func(t *testing.T) {
				warmPathsMatch(t, p.cfg, seed)
			})
		}
	}
}

func warmPathsMatch(t *testing.T, cfg Config, seed uint64) {
	var as [2]*Allocator
	var streams [2][2]vmm.Stream
	for i := range as {
		d := vmmtest.HostDriver(t, 8<<30)
		as[i] = newAlloc(t, d, cfg)
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, d.StreamDestroy(s)) })
		streams[i] = [2]vmm.Stream{0, s}
	}
	as[1].heap.SetWarmPaths(false)
	sizes := []uint64{512, 3000, 64 << 10, 700 << 10, 1 << 20, 2 << 20, 3 << 20, 5<<20 + 512, 12 << 20, 37 << 20}
	rng := rand.New(rand.NewPCG(seed, 17))
	type live struct {
		ptrs [2]vmm.DevicePtr
	}
	var lives []live
	for op := range 6000 {
		if len(lives) > 0 && (rng.IntN(100) < 45 || len(lives) > 300) {
			i := rng.IntN(len(lives))
			for k, a := range as {
				require.NoError(t, a.Free(lives[i].ptrs[k]), "op %d", op)
			}
			lives[i] = lives[len(lives)-1]
			lives = lives[:len(lives)-1]
		} else {
			n := sizes[rng.IntN(len(sizes))]
			if rng.IntN(8) == 0 {
				n += uint64(rng.IntN(1 << 16))
			}
			si := 0
			if rng.IntN(5) == 0 {
				si = 1
			}
			var l live
			for k, a := range as {
				p, err := a.Alloc(n, streams[k][si])
				require.NoError(t, err, "op %d", op)
				l.ptrs[k] = p
			}
			lives = append(lives, l)
			require.Equal(t, placeOf(t, as[0], l.ptrs[0]), placeOf(t, as[1], l.ptrs[1]), "op %d: %d bytes on stream %d", op, n, si)
		}
		if op%500 == 499 {
			requireSameLayout(t, as[0], as[1], op)
		}
	}
	for _, l := range lives {
		for k, a := range as {
			require.NoError(t, a.Free(l.ptrs[k]))
		}
	}
	requireSameLayout(t, as[0], as[1], -1)
}

// place is where a block lies, the same for two allocators of one
// layout: its segment's stream slot, pool and rank among that
// stream's and pool's segments by address, and its offset in it.
type place struct {
	stream bool // on a stream other than 0
	pool   string
	rank   int
	offset uint64
}

func placeOf(t *testing.T, a *Allocator, p vmm.DevicePtr) place {
	t.Helper()
	for _, s := range normalSegments(a.Snapshot()) {
		if p >= s.Base && p < s.Base.Add(s.Reserved) {
			return place{s.Stream != 0, s.Pool, s.rank, uint64(p - s.Base)}
		}
	}
	t.Fatalf("%v is in no segment", p)
	return place{}
}

// normalSegment is a segment of a snapshot with its rank among the
// segments of its stream and pool, by address.
type normalSegment struct {
	spec.Segment
	rank int
}

func normalSegments(sn spec.Snapshot) []normalSegment {
	segs := slices.Clone(sn.Segments)
	slices.SortFunc(segs, func(x, y spec.Segment) int {
		return cmp.Or(cmp.Compare(x.Stream, y.Stream), cmp.Compare(x.Pool, y.Pool), cmp.Compare(x.Base, y.Base))
	})
	out := make([]normalSegment, len(segs))
	for i, s := range segs {
		out[i].Segment = s
		if i > 0 && segs[i-1].Stream == s.Stream && segs[i-1].Pool == s.Pool {
			out[i].rank = out[i-1].rank + 1
		}
	}
	return out
}

// requireSameLayout checks that a and b hold the same blocks and mapped
// pages at the same offsets of their segments, and the same statistics.
func requireSameLayout(t *testing.T, a, b *Allocator, op int) {
	t.Helper()
	type seg struct {
		place
		blocks []spec.Block
		mapped []spec.Range
	}
	norm := func(a *Allocator) ([]seg, spec.Stats) {
		sn := a.Snapshot()
		var out []seg
		for _, s := range normalSegments(sn) {
			n := seg{place: place{s.Stream != 0, s.Pool, s.rank, 0}}
			for _, bl := range s.Blocks {
				bl.Ptr -= s.Base
				n.blocks = append(n.blocks, bl)
			}
			for _, r := range s.Mapped {
				r.Ptr -= s.Base
				n.mapped = append(n.mapped, r)
			}
			out = append(out, n)
		}
		st := sn.Stats
		st.SyncNanos, st.PageNanos = 0, 0 // times, which differ run to run
		return out, st
	}
	sa, sta := norm(a)
	sb, stb := norm(b)
	require.Equal(t, sa, sb, "layout after op %d", op)
	require.Equal(t, sta, stb, "statistics after op %d", op)
}
