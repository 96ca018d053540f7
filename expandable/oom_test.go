package expandable

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

func TestOOMEmptiesAnotherStreamsCache(t *testing.T) {
	d := vmmtest.HostDriver(t, 100<<20) // five 20 MiB pages
	a := newAlloc(t, d, ClassicConfig())
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	defer func() {
		require.NoError(t, a.Close())
		require.NoError(t, d.StreamDestroy(s))
	}()

	p, err := a.Alloc(80<<20, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(p)) // four pages cached on stream s
	q, err := a.Alloc(60<<20, 0)  // needs three: only after s's are unmapped
	require.NoError(t, err)
	st := a.Stats()
	require.Equal(t, int64(1), st.NumAllocRetries)
	require.Zero(t, st.NumOOMs)
	require.Equal(t, int64(60<<20), st.ReservedBytes.All.Current)
	require.NoError(t, a.Free(q))
}

func TestOOMErrorSaysWhat(t *testing.T) {
	d := vmmtest.HostDriver(t, 100<<20)
	cfg := ClassicConfig()
	cfg.OOMMaxRetries = 2
	cfg.OOMDelay = time.Millisecond
	a := newAlloc(t, d, cfg)
	p, err := a.Alloc(60<<20, 0)
	require.NoError(t, err)
	_, err = a.Alloc(60<<20, 0)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	for _, want := range []string{"allocating 62914560 bytes", "bytes free of 104857600", "reserves 62914560 bytes", "62914560 allocated", "after 3 retries"} {
		require.ErrorContains(t, err, want)
	}
	st := a.Stats()
	require.Equal(t, int64(1), st.NumOOMs)
	require.Equal(t, int64(3), st.NumAllocRetries)
	require.NoError(t, a.Free(p))
}

// fullAlloc is an allocator of 100 MiB (the classic policy, set applied
// to its configuration) with 60 MiB allocated (p): another 60 MiB does not
// fit. fullWaiting's allocations wait up to 5 s for frees.
func fullAlloc(t *testing.T, set func(*Config)) (a *Allocator, p vmm.DevicePtr) {
	t.Helper()
	cfg := ClassicConfig()
	set(&cfg)
	a = newAlloc(t, vmmtest.HostDriver(t, 100<<20), cfg)
	p, err := a.Alloc(60<<20, 0)
	require.NoError(t, err)
	return a, p
}

func fullWaiting(t *testing.T) (*Allocator, vmm.DevicePtr) {
	return fullAlloc(t, func(c *Config) { c.OOMWait = 5 * time.Second })
}

// allocWhileFreed allocates another 60 MiB of a fullAlloc while another
// goroutine frees p 20 ms in, and returns the block and how long it took.
func allocWhileFreed(t *testing.T, a *Allocator, p vmm.DevicePtr) (vmm.DevicePtr, time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, a.Free(p))
	})
	start := time.Now()
	q, err := a.Alloc(60<<20, 0)
	require.NoError(t, err)
	return q, time.Since(start)
}

func TestOOMWaitsForFrees(t *testing.T) {
	a, p := fullWaiting(t)
	q, took := allocWhileFreed(t, a, p)
	require.Less(t, took, 4*time.Second, "woken by the free, not the deadline")
	require.NoError(t, a.Free(q))
}

// TestOOMWaitHook: the hook hears each wait and sleep of the OOM policy
// begin (true) and end (false), in pairs, without the allocator's lock: a
// free from the hook itself (a deferred free applied there) ends the wait
// at once under OOMWait, and lets the retry after the backoff's first
// sleep succeed; a nil hook is none.
func TestOOMWaitHook(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*Config)
	}{
		{"wait", func(c *Config) { c.OOMWait = 20 * time.Second }},
		{"retries", func(c *Config) { c.OOMMaxRetries, c.OOMDelay = 5, 300*time.Millisecond }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := vmmtest.HostDriver(t, 100<<20)
			cfg := ClassicConfig()
			c.set(&cfg)
			a := newAlloc(t, d, cfg)
			p, err := a.Alloc(60<<20, 0)
			require.NoError(t, err)
			var calls []bool
			a.SetOOMWaitHook(func(waiting bool) {
				calls = append(calls, waiting)
				if waiting && p != 0 {
					require.NoError(t, a.Free(p)) // takes the lock: the hook runs without it
					p = 0
				}
			})
			start := time.Now()
			q, err := a.Alloc(60<<20, 0)
			require.NoError(t, err)
			require.Less(t, time.Since(start), time.Second, "the hook's free did not end the wait (or the first sleep)")
			require.Equal(t, []bool{true, false}, calls)
			require.NoError(t, a.Free(q))

			a.SetOOMWaitHook(nil)
			r, err := a.Alloc(60<<20, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(r))
			require.Equal(t, []bool{true, false}, calls, "an allocation that found room waited")
		})
	}
}

func TestAllocAtMost(t *testing.T) {
	d := vmmtest.HostDriver(t, 100<<20)
	a := newAlloc(t, d, ClassicConfig())
	p, size, err := a.AllocAtMost(1<<30, 10<<20, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, size, uint64(10<<20))
	require.LessOrEqual(t, size, uint64(100<<20))
	require.Less(t, size, uint64(1<<30))
	_, _, err = a.AllocAtMost(1<<30, 90<<20, 0)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory, "min cannot be met")
	require.Equal(t, int64(1), a.Stats().NumOOMs, "only the final attempt counts as an OOM")
	require.NoError(t, a.Free(p))
	q, size, err := a.AllocAtMost(40<<20, 1<<20, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(40<<20), size, "max is taken when it fits")
	require.NoError(t, a.Free(q))
}

// TestOOMWaitWokenByFreeOnAnotherStream: an allocation waiting for frees
// (OOMWait, no backoff retries) gets the memory of a block that another
// goroutine frees on another stream, whose pages stay cached on that
// stream until they are unmapped; it does not wait out OOMWait and fail.
func TestOOMWaitWokenByFreeOnAnotherStream(t *testing.T) {
	underPolicies(t, func(t *testing.T, cfg Config) {
		d := vmmtest.HostDriver(t, 100<<20)
		cfg.OOMWait = 2 * time.Second
		cfg.OOMMaxRetries = 0
		a := newAlloc(t, d, cfg)
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		defer func() { require.NoError(t, d.StreamDestroy(s)) }()
		p, err := a.Alloc(60<<20, s)
		require.NoError(t, err)
		var wg sync.WaitGroup
		wg.Go(func() {
			// Free once the allocation below waits: its log says so.
			for a.Stats().NumAllocRetries == 0 {
				time.Sleep(time.Millisecond)
			}
			require.NoError(t, a.Free(p))
		})
		q, err := a.Alloc(60<<20, 0)
		require.NoError(t, err, "the freed block's pages stayed cached on the other stream")
		wg.Wait()
		require.Zero(t, a.Stats().NumOOMs)
		require.NoError(t, a.Free(q))
	})
}

// TestOOMWhenMappingsRunOut: a stream per allocation, each a range of its
// own, until the host driver's bound on mappings (host.Options.MaxMappings,
// which stands for the process's vm.max_map_count) refuses: allocations
// then fail with vmm.ErrOutOfMemory, as when memory runs out, and the
// allocator goes on working; everything goes back at Close.
func TestOOMWhenMappingsRunOut(t *testing.T) {
	hd, err := host.Open(host.Options{MaxMappings: 40})
	require.NoError(t, err)
	vmmtest.CheckLeaks(t, hd)
	defer func() { require.NoError(t, hd.Close()) }()
	a, err := New(hd, 0, DefaultConfig(), nil)
	require.NoError(t, err)
	var ptrs []vmm.DevicePtr
	var streams []vmm.Stream
	failed := 0
	for range 40 {
		s, err := hd.StreamCreate(0)
		require.NoError(t, err)
		streams = append(streams, s)
		p, err := a.Alloc(4096, s)
		if err != nil {
			require.ErrorIs(t, err, vmm.ErrOutOfMemory)
			failed++
			continue
		}
		ptrs = append(ptrs, p)
	}
	require.NotZero(t, failed, "the bound never refused")
	require.NotEmpty(t, ptrs)
	require.Equal(t, int64(failed), a.Stats().NumOOMs)
	for _, p := range ptrs {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.EmptyCache())
	p, err := a.Alloc(4096, streams[len(streams)-1])
	require.NoError(t, err, "room again once the ranges went back")
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Close())
	for _, s := range streams {
		require.NoError(t, hd.StreamDestroy(s))
	}
}

// TestOOMWaitHookPanics: a wait hook that panics (as the wait begins or
// as it ends) panics the allocation, and leaves the allocator's lock as it
// was: the allocator goes on working and no other caller's lock is given
// away (the panic came out between a released lock and the caller's
// deferred Unlock, which then unlocked a lock it did not hold). Also
// under -race, where that unlock was a fatal error.
func TestOOMWaitHookPanics(t *testing.T) {
	for _, when := range []bool{true, false} {
		a, p := fullWaiting(t)
		a.SetOOMWaitHook(func(waiting bool) {
			if waiting == when {
				panic("hook")
			}
		})
		if !when {
			// Ending the wait needs a free to end it early.
			go func() {
				time.Sleep(20 * time.Millisecond)
				require.NoError(t, a.Free(p))
			}()
		}
		require.PanicsWithValue(t, "hook", func() { _, _ = a.Alloc(60<<20, 0) }, "panic on %v", when)
		a.SetOOMWaitHook(nil)
		_ = a.Stats() // takes the lock: it was left free
		if when {
			require.NoError(t, a.Free(p))
		}
		q, err := a.Alloc(60<<20, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(q))
		require.NoError(t, a.SetMemoryFraction(0.5))
		require.NoError(t, a.Close())
		require.ErrorIs(t, a.SetMemoryFraction(0.5), vmm.ErrClosed, "after Close")
	}
}

// TestOOMRetryReusesFreedBlock: a block freed while an allocation sleeps in
// the OOM backoff is reused where it is by the next retry: nothing is
// unmapped and mapped again. The retry used to empty the cache before it
// looked, which unmapped the freed block's pages and mapped them back (on
// an H100, 1.3 s for 44 GiB).
func TestOOMRetryReusesFreedBlock(t *testing.T) {
	a, p := fullAlloc(t, func(c *Config) { c.OOMMaxRetries, c.OOMDelay = 3, 100*time.Millisecond })
	before := a.Stats()
	q, _ := allocWhileFreed(t, a, p)
	after := a.Stats()
	require.Equal(t, p, q, "the freed block, where it was")
	require.Equal(t, before.Unmaps, after.Unmaps, "pages unmapped by the retry")
	require.Equal(t, before.Maps, after.Maps, "pages mapped by the retry")
	require.NoError(t, a.Free(q))
}
