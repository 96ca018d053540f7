package expandable

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/cuda"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// benchDriver is the backend of the *Driver benchmarks: CUDA when
// XSEG_BENCH_BACKEND=cuda (the GPU machine), else the host backend.
func benchDriver(b testing.TB) vmm.Driver {
	if os.Getenv("XSEG_BENCH_BACKEND") != "cuda" {
		return vmmtest.HostDriver(b, 0)
	}
	d, err := cuda.Open()
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, d.Close()) })
	return d
}

// BenchmarkAllocFreeCachedDriver is BenchmarkAllocFreeCached over the
// benchmark backend: on a warm cache no driver call is made, so the figure
// is the allocator's own cost on that machine's CPU.
func BenchmarkAllocFreeCachedDriver(b *testing.B) {
	a := newAlloc(b, benchDriver(b), ClassicConfig())
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
}

// benchGrowTimed times only the Alloc that maps pages fresh pages (created,
// mapped, one set-access for the run); freeing and giving the pages back
// happen with the timer stopped. It reports microseconds per grow (mean
// and median, the figure torch_replay-side scripts quote for PyTorch) and
// per page.
func benchGrowTimed(b *testing.B, pages uint64) {
	cfg := ClassicConfig()
	cfg.PageCacheBytes = 0
	a := newAlloc(b, benchDriver(b), cfg)
	size := pages * cfg.LargePageSize
	var times []time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		p, err := a.Alloc(size, 0)
		times = append(times, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		require.NoError(b, a.Free(p))
		require.NoError(b, a.EmptyCache())
		b.StartTimer()
	}
	st := a.Stats()
	require.Equal(b, int64(b.N)*int64(pages), st.Maps)
	require.Equal(b, int64(b.N), st.SetAccessCalls)
	per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	slices.Sort(times)
	b.ReportMetric(per/1e3, "us/grow")
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds())/1e3, "us/grow-median")
	b.ReportMetric(per/1e3/float64(pages), "us/page")
}

// BenchmarkGrowDriver1Page grows by one 20 MiB page.
func BenchmarkGrowDriver1Page(b *testing.B) { benchGrowTimed(b, 1) }

// BenchmarkGrowDriver64Pages grows by a run of 64 20 MiB pages.
func BenchmarkGrowDriver64Pages(b *testing.B) { benchGrowTimed(b, 64) }
