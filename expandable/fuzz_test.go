package expandable

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// model is the shadow of an allocator: the live blocks it handed out.
type model struct {
	live  map[vmm.DevicePtr]uint64 // ptr -> requested size
	bytes int64                    // requested bytes of the live blocks
}

// check compares the allocator with the model: live blocks do not overlap,
// lie inside mapped ranges, and the stats add up.
func (m *model) check(t testing.TB, a *Allocator) {
	snap := a.Snapshot()
	type span struct{ lo, hi vmm.DevicePtr }
	var mapped, blocks []span
	var requested int64
	for _, seg := range snap.Segments {
		for _, r := range seg.Mapped {
			mapped = append(mapped, span{r.Ptr, r.Ptr.Add(r.Size)})
		}
		for _, b := range seg.Blocks {
			if b.State != core.BlockAllocated {
				continue
			}
			req, ok := m.live[b.Ptr]
			require.True(t, ok, "allocated block %v unknown to the model", b.Ptr)
			require.Equal(t, req, b.Requested)
			requested += int64(b.Requested)
			blocks = append(blocks, span{b.Ptr, b.Ptr.Add(b.Size)})
		}
	}
	require.Len(t, blocks, len(m.live))
	for i, b := range blocks {
		if i > 0 && blocks[i-1].hi > b.lo && blocks[i-1].lo < b.hi {
			t.Fatalf("blocks %v and %v overlap", blocks[i-1], b)
		}
		inside := false
		for _, r := range mapped {
			inside = inside || (b.lo >= r.lo && b.hi <= r.hi)
		}
		require.True(t, inside, "block %v is not inside a mapped range", b)
	}
	st := snap.Stats
	require.Equal(t, int64(len(m.live)), st.Allocations.All.Current)
	require.Equal(t, m.bytes, st.RequestedBytes.All.Current)
	require.Equal(t, requested, m.bytes)
}

var fuzzSizes = []uint64{1, 512, 513, 4096, 1 << 20, 1<<20 + 1, 3 << 20, 21 << 20, 45 << 20}

// drive runs the operations the bytes say on a, checking against the model.
// An operation is a pair of bytes: the first picks it (mod 10), the second
// is its argument. 0-3 allocate on a stream (8: in a private pool, 9:
// AllocAtMost between half the size and the size), 4-5 free, 6 records a
// use on the other stream, 7 empties the cache. The private pool is
// retained at the start and released once the blocks are gone.
func drive(t testing.TB, a *Allocator, streams []vmm.Stream, ops []byte) *model {
	m := &model{live: map[vmm.DevicePtr]uint64{}}
	var order []vmm.DevicePtr
	pool := core.PoolID{First: 7, Second: 7}
	require.NoError(t, a.RetainPool(pool))
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i]%10, int(ops[i+1])
		size := fuzzSizes[arg%len(fuzzSizes)] + uint64(arg/len(fuzzSizes))*512
		s := streams[arg%len(streams)]
		switch {
		case op < 4 || op >= 8:
			var p vmm.DevicePtr
			var err error
			switch op {
			case 8:
				p, err = a.AllocInPool(pool, size, s)
			case 9:
				p, size, err = a.AllocAtMost(size, size/2+1, s)
			default:
				p, err = a.Alloc(size, s)
			}
			if errors.Is(err, vmm.ErrOutOfMemory) {
				continue
			}
			require.NoError(t, err)
			m.live[p] = size
			m.bytes += int64(size)
			order = append(order, p)
		case op < 7 && len(order) > 0:
			j := arg % len(order)
			p := order[j]
			if op == 6 {
				require.NoError(t, a.RecordStream(p, streams[(arg+1)%len(streams)]))
				continue
			}
			require.NoError(t, a.Free(p))
			require.ErrorIs(t, a.Free(p), vmm.ErrInvalid)
			m.bytes -= int64(m.live[p])
			delete(m.live, p)
			order = append(order[:j], order[j+1:]...)
		case op == 7:
			require.NoError(t, a.EmptyCache())
		}
		m.check(t, a)
	}
	for _, p := range order {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.ReleasePool(pool))
	return m
}

// fuzzPolicies are the configurations FuzzAllocator runs each input
// under: the classic policy, the default (2 MiB pages recycled on growth,
// chunks past the chunk mark), the default with size classes, and the
// steady policy (2 MiB pages never moved).
func fuzzPolicies() map[string]Config {
	classes := DefaultConfig()
	classes.SizeClasses = true
	return map[string]Config{"classic": ClassicConfig(), "default": DefaultConfig(), "size_classes": classes, "steady": SteadyConfig(), "settle_chains": settleChainsConfig()}
}

// FuzzAllocator drives an allocator with the operations the input says,
// under each of fuzzPolicies, against the model: blocks never overlap,
// lie inside mapped memory, the statistics add up, and after EmptyCache
// and Close nothing is left with the driver.
func FuzzAllocator(f *testing.F) {
	f.Add([]byte{0, 1, 0, 5, 0, 7, 4, 0, 6, 1, 4, 1, 7, 0})
	f.Add([]byte{1, 8, 2, 17, 3, 26, 4, 2, 0, 9, 5, 0, 7, 7, 0, 3})
	f.Add([]byte{0, 8, 1, 62, 2, 71, 3, 8, 4, 1, 0, 7, 5, 0, 1, 6, 4, 0, 2, 80, 6, 2, 5, 1, 7, 0, 3, 35})
	policies := fuzzPolicies()
	f.Fuzz(func(t *testing.T, ops []byte) {
		for name, cfg := range policies {
			t.Run(name, func(t *testing.T) { fuzzOne(t, cfg, ops) })
		}
	})
}

func fuzzOne(t *testing.T, cfg Config, ops []byte) {
	d, err := hostOpen(200 << 20)
	require.NoError(t, err)
	defer d.Close()
	a, err := New(d, 0, cfg, nil)
	require.NoError(t, err)
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	drive(t, a, []vmm.Stream{0, s}, ops)
	require.NoError(t, a.EmptyCache())
	st := a.Stats()
	require.Zero(t, st.ReservedBytes.All.Current)
	require.Zero(t, st.ActiveBytes.All.Current)
	u := d.Usage()
	require.Zero(t, u.Mappings, "%v", u)
	require.Zero(t, u.Handles, "%v", u)
	require.Zero(t, u.Ranges, "%v", u)
	require.NoError(t, a.Close())
	require.NoError(t, d.StreamDestroy(s))
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
}

// TestFaultInjection fails, one at a time, the n-th call of each driver
// operation the allocator makes during a workload that allocates, grows,
// records streams, frees and empties the cache: the error comes back, the
// allocator stays consistent, and nothing leaks after Close.
func TestFaultInjection(t *testing.T) {
	ops := []vmmtest.Op{vmmtest.OpReserve, vmmtest.OpCreate, vmmtest.OpMap, vmmtest.OpSetAccess,
		vmmtest.OpUnmap, vmmtest.OpRelease, vmmtest.OpUnreserve, vmmtest.OpEventCreate, vmmtest.OpEventRecord,
		vmmtest.OpStreamSynchronize, vmmtest.OpEventSynchronize, vmmtest.OpEventDestroy}
	rng := rand.New(rand.NewPCG(1, 2))
	work := make([]byte, 120)
	for i := range work {
		work[i] = byte(rng.IntN(256))
	}
	hits := map[vmmtest.Op]int{}
	defer func() {
		for _, op := range ops {
			require.Positive(t, hits[op], "no injected failure of %s reached the caller", op)
		}
	}()
	for _, op := range ops {
		for n := 1; n <= 6; n++ {
			d, err := hostOpen(200 << 20)
			require.NoError(t, err)
			f := vmmtest.NewFaulty(d)
			s, err := d.StreamCreate(0)
			require.NoError(t, err)
			a, err := New(f, 0, ClassicConfig(), nil)
			require.NoError(t, err)
			f.FailNth(op, n, vmmtest.ErrInjected)
			failed := runFaulty(t, a, []vmm.Stream{0, s}, work)
			if failed != nil {
				require.ErrorIs(t, failed, vmmtest.ErrInjected, "%s #%d", op, n)
			}
			closeErr := a.Close()
			if closeErr != nil && failed == nil {
				require.ErrorIs(t, closeErr, vmmtest.ErrInjected)
				failed = closeErr
			}
			if failed != nil {
				hits[op]++
			}
			if failed != nil && (op == vmmtest.OpUnmap || op == vmmtest.OpRelease || op == vmmtest.OpUnreserve || op == vmmtest.OpEventDestroy) {
				// The injected failure left one object behind on purpose;
				// the allocator said so. Release what it reports.
				_ = d.Close()
				continue
			}
			require.NoError(t, d.StreamDestroy(s))
			require.True(t, d.Usage().Zero(), "%s #%d leaked %v (error %v)", op, n, d.Usage(), failed)
			require.NoError(t, d.Close())
		}
	}
}

// runFaulty runs the workload and returns the first error, checking the
// allocator's books after it.
func runFaulty(t *testing.T, a *Allocator, streams []vmm.Stream, ops []byte) (first error) {
	var live []vmm.DevicePtr
	note := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i]%8, int(ops[i+1])
		switch {
		case op < 4:
			p, err := a.Alloc(fuzzSizes[arg%len(fuzzSizes)], streams[arg%len(streams)])
			if err == nil {
				live = append(live, p)
			} else if !errors.Is(err, vmm.ErrOutOfMemory) {
				note(err)
			}
		case op < 7 && len(live) > 0:
			j := arg % len(live)
			if op == 6 {
				require.NoError(t, a.RecordStream(live[j], streams[(arg+1)%len(streams)]))
				continue
			}
			if err := a.Free(live[j]); err != nil {
				note(err)
				continue
			}
			live = append(live[:j], live[j+1:]...)
		case op == 7:
			note(a.EmptyCache())
		}
		snap := a.Snapshot()
		require.Equal(t, int64(len(live)), snap.Stats.Allocations.All.Current)
	}
	for _, p := range live {
		note(a.Free(p))
	}
	note(a.EmptyCache())
	return first
}

// TestConcurrentStress: 8 goroutines allocate and free on 3 streams, with
// record_stream and EmptyCache mixed in, under the default configuration
// and under recycle_pages (growths that take other streams' free pages),
// also with chunk_mb (growths in chunks, split when a block would end
// inside a free one).
func TestConcurrentStress(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{{"default", ClassicConfig()}, {"recycle", recycleConfig(true)}, {"chunks", chunksRecycleConfig()}} {
		t.Run(tc.name, func(t *testing.T) { concurrentStress(t, tc.cfg) })
	}
}

func concurrentStress(t *testing.T, cfg Config) {
	d := vmmtest.HostDriver(t, 0)
	a := newAlloc(t, d, cfg)
	streams := []vmm.Stream{0}
	for range 2 {
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		streams = append(streams, s)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var live []vmm.DevicePtr
			for i := range 2000 {
				if len(live) > 0 && rng.IntN(2) == 0 {
					j := rng.IntN(len(live))
					if rng.IntN(4) == 0 {
						require.NoError(t, a.RecordStream(live[j], streams[rng.IntN(len(streams))]))
					}
					require.NoError(t, a.Free(live[j]))
					live = append(live[:j], live[j+1:]...)
					continue
				}
				p, err := a.Alloc(fuzzSizes[rng.IntN(len(fuzzSizes))], streams[i%len(streams)])
				require.NoError(t, err)
				live = append(live, p)
				if i%500 == 0 {
					require.NoError(t, a.EmptyCache())
				}
			}
			for _, p := range live {
				require.NoError(t, a.Free(p))
			}
		})
	}
	wg.Wait()
	st := a.Stats()
	require.Zero(t, st.AllocatedBytes.All.Current)
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
	require.NoError(t, a.Close())
	for _, s := range streams[1:] {
		require.NoError(t, d.StreamDestroy(s))
	}
}
