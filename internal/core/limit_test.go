package core_test

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// The tests of the memory limit and the history run on both allocators
// over the host backend: the Heap holds the logic, each Backing the place
// where memory is made (pages mapped into a range, or whole segments).

const mib = core.MiB

// allocator is what both allocators offer.
type allocator interface {
	xseg.Allocator
	xseg.MemoryLimiter
	xseg.Historian
	xseg.Pools
}

type kind struct {
	name string
	open func(d vmm.Driver, cfg core.Config) (allocator, error)
	// segmentEvents are the history actions of memory made and given
	// back.
	made, gone string
}

var kinds = []kind{
	{"expandable", func(d vmm.Driver, cfg core.Config) (allocator, error) {
		a, err := expandable.New(d, 0, cfg, nil)
		if err != nil {
			return nil, err
		}
		return a, nil
	}, core.ActionSegmentMap, core.ActionSegmentUnmap},
	{"fallback", func(d vmm.Driver, cfg core.Config) (allocator, error) {
		a, err := fallback.New(d, 0, cfg, nil)
		if err != nil {
			return nil, err
		}
		return a, nil
	}, core.ActionSegmentAlloc, core.ActionSegmentFree},
}

// forKinds runs f as a subtest for each allocator.
func forKinds(t *testing.T, f func(t *testing.T, k kind)) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { f(t, k) })
	}
}

// newAlloc makes an allocator of kind k over d that the test closes.
func newAlloc(t *testing.T, k kind, d vmm.Driver, cfg core.Config) allocator {
	t.Helper()
	a, err := k.open(d, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

func reserved(a allocator) int64 { return a.Stats().ReservedBytes.All.Current }

// TestLimitStopsGrowth: growth up to the limit works, past it fails as
// out of memory naming the limit, at once: no waits, no delayed retries.
func TestLimitStopsGrowth(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		cfg := core.ClassicConfig()
		cfg.OOMMaxRetries, cfg.OOMDelay, cfg.OOMWait = 3, time.Second, 10*time.Second
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), cfg)
		a.SetMemoryLimit(60 * mib)
		require.Equal(t, uint64(60*mib), a.MemoryLimit())
		require.Equal(t, uint64(60*mib), a.Stats().MemoryLimit)
		p, err := a.Alloc(40*mib, 0)
		require.NoError(t, err)
		q, err := a.Alloc(20*mib, 0)
		require.NoError(t, err, "up to the limit exactly")
		require.Equal(t, int64(60*mib), reserved(a))

		start := time.Now()
		_, err = a.Alloc(2*mib, 0) // a new 20 MiB page or segment
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		require.Less(t, time.Since(start), time.Second, "no OOMWait, no OOMDelay")
		require.ErrorContains(t, err, "stopped by the memory limit")
		require.ErrorContains(t, err, "memory limit of 62914560 bytes")
		require.NotContains(t, err.Error(), "fraction")
		st := a.Stats()
		require.Equal(t, int64(1), st.NumOOMs)
		require.Equal(t, int64(1), st.NumAllocRetries, "the cache was emptied and tried once")
		require.Equal(t, int64(60*mib), st.ReservedBytes.All.Current)
		require.NoError(t, a.Free(p))
		require.NoError(t, a.Free(q))
	})
}

// TestLimitEmptiesCacheFirst: memory cached on another stream is given
// back before the limit fails an allocation, as PyTorch does.
func TestLimitEmptiesCacheFirst(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		d := vmmtest.HostDriver(t, 1<<30)
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, d.StreamDestroy(s)) })
		a := newAlloc(t, k, d, core.ClassicConfig())
		a.SetMemoryLimit(60 * mib)
		p, err := a.Alloc(40*mib, s)
		require.NoError(t, err)
		require.NoError(t, a.Free(p)) // 40 MiB cached for stream s
		q, err := a.Alloc(40*mib, 0)
		require.NoError(t, err, "stream s's cache was emptied")
		st := a.Stats()
		require.Equal(t, int64(1), st.NumAllocRetries)
		require.Zero(t, st.NumOOMs)
		require.Equal(t, int64(40*mib), st.ReservedBytes.All.Current)
		require.LessOrEqual(t, st.ReservedBytes.All.Peak, int64(60*mib))
		require.NoError(t, a.Free(q))
	})
}

// TestLimitZeroRemovesIt: limit 0 is no limit.
func TestLimitZeroRemovesIt(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		a.SetMemoryLimit(20 * mib)
		_, err := a.Alloc(40*mib, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		a.SetMemoryLimit(0)
		require.Zero(t, a.MemoryLimit())
		require.Zero(t, a.MemoryFraction())
		require.Zero(t, a.Stats().MemoryLimit)
		p, err := a.Alloc(40*mib, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
	})
}

// TestLimitBelowReserved: a limit under the reserved bytes is allowed; the
// memory already reserved stays usable, growth fails until EmptyCache.
func TestLimitBelowReserved(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		p, err := a.Alloc(60*mib, 0)
		require.NoError(t, err)
		a.SetMemoryLimit(20 * mib)
		require.Equal(t, int64(60*mib), reserved(a), "nothing is taken away")
		require.NoError(t, a.Free(p))
		q, err := a.Alloc(40*mib, 0)
		require.NoError(t, err, "cached memory is reused above the limit")
		r, err := a.Alloc(30*mib, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory, "growth is not: %v", r)
		require.NoError(t, a.Free(q))
		require.NoError(t, a.EmptyCache())
		require.Zero(t, reserved(a))
		q, err = a.Alloc(20*mib, 0)
		require.NoError(t, err, "under the limit again")
		_, err = a.Alloc(2*mib, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		require.NoError(t, a.Free(q))
	})
}

// TestMemoryFraction: PyTorch's set_per_process_memory_fraction: a share
// of the device's memory, rounded down, named in the OOM error; bad
// fractions change nothing.
func TestMemoryFraction(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		require.NoError(t, a.SetMemoryFraction(0.05))
		want := uint64(math.Floor(0.05 * (1 << 30)))
		require.Equal(t, want, a.MemoryLimit())
		require.Equal(t, 0.05, a.MemoryFraction())
		p, err := a.Alloc(40*mib, 0)
		require.NoError(t, err)
		_, err = a.Alloc(20*mib, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		require.ErrorContains(t, err, "memory limit of 53687091 bytes, set as memory fraction 0.05 of the device's 1073741824 bytes")

		for _, f := range []float64{-0.1, 1.5, math.NaN(), math.Inf(1)} {
			require.ErrorIs(t, a.SetMemoryFraction(f), vmm.ErrInvalid, "%v", f)
			require.Equal(t, want, a.MemoryLimit(), "unchanged by %v", f)
			require.Equal(t, 0.05, a.MemoryFraction())
		}
		require.NoError(t, a.SetMemoryFraction(1))
		require.Equal(t, uint64(1<<30), a.MemoryLimit())
		require.Equal(t, 1.0, a.MemoryFraction())
		a.SetMemoryLimit(512 * mib)
		require.Equal(t, 0.5, a.MemoryFraction(), "a limit in bytes as a fraction")

		require.NoError(t, a.Free(p))
		require.NoError(t, a.EmptyCache())
		require.NoError(t, a.SetMemoryFraction(0))
		require.Zero(t, a.MemoryFraction())
		_, err = a.Alloc(1024, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory, "fraction 0 allows nothing, as in PyTorch")
		require.ErrorContains(t, err, "memory limit of 0 bytes, set as memory fraction 0 of")
	})
}

// TestLimitAllocAtMost: AllocAtMost shrinks its request to fit the limit.
func TestLimitAllocAtMost(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		a.SetMemoryLimit(40 * mib)
		p, size, err := a.AllocAtMost(100*mib, 10*mib, 0)
		require.NoError(t, err)
		require.GreaterOrEqual(t, size, uint64(10*mib))
		require.LessOrEqual(t, size, uint64(40*mib))
		require.LessOrEqual(t, reserved(a), int64(40*mib))
		require.Zero(t, a.Stats().NumOOMs, "only the final attempt counts")
		require.NoError(t, a.Free(p))
	})
}

// TestLimitConcurrent: allocations race with changes of the limit; none
// fails but for memory, and reserved memory never passes the highest
// limit set.
func TestLimitConcurrent(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		a.SetMemoryLimit(100 * mib)
		stop := make(chan struct{})
		var setter sync.WaitGroup
		setter.Go(func() {
			limits := []uint64{100 * mib, 50 * mib, 80 * mib}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a.SetMemoryLimit(limits[i%len(limits)])
				_ = a.MemoryLimit()
				_ = a.MemoryFraction()
				time.Sleep(50 * time.Microsecond)
			}
		})
		var workers sync.WaitGroup
		for w := range 8 {
			workers.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				var held []vmm.DevicePtr
				for range 300 {
					// 10 to 30 MiB, up to four held: one worker alone
					// passes the 50 MiB limit, so OOMs come however the
					// workers are scheduled.
					p, err := a.Alloc(10*mib+rng.Uint64N(20*mib), 0)
					if err != nil {
						require.ErrorIs(t, err, vmm.ErrOutOfMemory)
					} else {
						held = append(held, p)
					}
					if len(held) > 3 || (err != nil && len(held) > 0) {
						require.NoError(t, a.Free(held[0]))
						held = held[1:]
					}
				}
				for _, p := range held {
					require.NoError(t, a.Free(p))
				}
			})
		}
		workers.Wait()
		close(stop)
		setter.Wait()
		st := a.Stats()
		require.Positive(t, st.NumOOMs, "the limits were reached")
		require.LessOrEqual(t, st.ReservedBytes.All.Peak, int64(100*mib))
		require.Zero(t, st.AllocatedBytes.All.Current)
		require.NoError(t, a.EmptyCache())
		require.Zero(t, reserved(a))
	})
}
