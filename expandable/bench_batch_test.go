package expandable

import (
	"testing"

	"github.com/xseg-dev/xseg/vmm"
)

// torchLatencySizes are the sizes of python/gpu/torch_latency.cpp (and latency.c).
var torchLatencySizes = []uint64{512, 4096, 65536, 1 << 20, 3 << 20, 24 << 20, 100 << 20}

// BenchmarkAllocFreeBatch is the batch loop of torch_latency.cpp, PyTorch's own
// cost figure: allocate one block of each size, then free them all, on a
// warm cache. ns/op is per Alloc+Free pair, as that program reports it.
// Unlike BenchmarkAllocFreeCached, the freed blocks here lie next to each
// other, so the allocator coalesces and splits on every round.
func BenchmarkAllocFreeBatch(b *testing.B) {
	a := newAlloc(b, benchDriver(b), ClassicConfig())
	ps := make([]vmm.DevicePtr, len(torchLatencySizes))
	round := func() {
		for j, n := range torchLatencySizes {
			p, err := a.Alloc(n, 0)
			if err != nil {
				b.Fatal(err)
			}
			ps[j] = p
		}
		for _, p := range ps {
			if err := a.Free(p); err != nil {
				b.Fatal(err)
			}
		}
	}
	round()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		round()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(torchLatencySizes)), "ns/pair")
}

// BenchmarkAllocFreeSingle is the single loop of torch_latency.cpp: allocate
// one block and free it at once, the sizes in turn, on a warm cache, under
// the default policy. ns/pair is per Alloc+Free pair.
func BenchmarkAllocFreeSingle(b *testing.B) {
	a := newAlloc(b, benchDriver(b), DefaultConfig())
	pair := func(n uint64) {
		p, err := a.Alloc(n, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(p); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range torchLatencySizes {
		pair(n)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, n := range torchLatencySizes {
			pair(n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(torchLatencySizes)), "ns/pair")
}
