package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// benchSizes are the request sizes the cached benchmarks cycle through,
// 512 B to 100 MiB. An array, so that len(benchSizes) is a constant and
// the loops' i%len(benchSizes) compiles to a mask: with a slice it was a
// 64-bit division a pair, no part of the allocator's cost (it was not
// what made some GPU machines' pairs slow: bench/RESULTS.md round 36).
var benchSizes = [...]uint64{512, 4 << 10, 100 << 10, 1 << 20, 3 << 20, 10 << 20, 37 << 20, 100 << 20}

// warm leaves one free block of each of benchSizes in the cache, each
// between two live blocks, as in a training loop where the tensors freed
// and reallocated each step sit among longer-lived ones.
func warm(b *testing.B, a *Allocator, s vmm.Stream) {
	var tmp []vmm.DevicePtr
	for range 2 {
		for _, n := range benchSizes {
			p, err := a.Alloc(n, s)
			require.NoError(b, err)
			q, err := a.Alloc(n, s) // the neighbour that stays
			require.NoError(b, err)
			tmp = append(tmp, p)
			_ = q
		}
	}
	for _, p := range tmp {
		require.NoError(b, a.Free(p))
	}
}

// BenchmarkAllocFreeCached is one Alloc and one Free of a size the cache
// holds, sizes cycling from 512 B to 100 MiB.
//
// It runs under the classic policy (its sub-benchmark name says so) and
// the default one.
func BenchmarkAllocFreeCached(b *testing.B) {
	b.Run("classic", func(b *testing.B) { benchCached(b, ClassicConfig()) })
	b.Run("default", func(b *testing.B) { benchCached(b, DefaultConfig()) })
}

func benchCached(b *testing.B, cfg Config) {
	a := newAlloc(b, vmmtest.HostDriver(b, 0), cfg)
	warm(b, a, 0)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		p, err := a.Alloc(benchSizes[i%len(benchSizes)], 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
	st := a.Stats()
	require.Zero(b, st.NumAllocRetries)
	// Whether the warm pairs took the lock's biased way: a slow run with
	// no bias, or with revocations, is the lock's doing.
	biases, revokes := a.heap.LockCounts()
	b.ReportMetric(float64(biases), "biases")
	b.ReportMetric(float64(revokes), "revokes")
}

// BenchmarkAllocFreeCachedParallel runs the pairs from GOMAXPROCS
// goroutines on one stream.
func BenchmarkAllocFreeCachedParallel(b *testing.B) {
	a := newAlloc(b, vmmtest.HostDriver(b, 0), ClassicConfig())
	for range 8 {
		warm(b, a, 0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			p, err := a.Alloc(benchSizes[i%len(benchSizes)], 0)
			if err != nil {
				b.Error(err)
				return
			}
			if err := a.Free(p); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchGrow allocates a block that needs pages fresh pages, frees it and
// empties the cache, each iteration; it reports nanoseconds per grow.
func benchGrow(b *testing.B, pages uint64) {
	cfg := ClassicConfig()
	cfg.PageCacheBytes = 0
	a := newAlloc(b, vmmtest.HostDriver(b, 0), cfg)
	size := pages * cfg.LargePageSize
	b.ResetTimer()
	for b.Loop() {
		p, err := a.Alloc(size, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
		if err := a.EmptyCache(); err != nil {
			b.Fatal(err)
		}
	}
	st := a.Stats()
	require.Equal(b, int64(b.N)*int64(pages), st.Maps)
	require.Equal(b, int64(b.N), st.SetAccessCalls)
}

// BenchmarkGrowOnePage grows by one 20 MiB page.
func BenchmarkGrowOnePage(b *testing.B) { benchGrow(b, 1) }

// BenchmarkGrow64Pages grows by a run of 64 pages: one Map a page, one
// SetAccess for the run.
func BenchmarkGrow64Pages(b *testing.B) { benchGrow(b, 64) }
