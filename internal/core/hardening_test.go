package core_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// Tests of issue 15 (items 5, 6, 9, 10) on both allocators over the host
// backend.

// Issue 15 item 5: with oom_size_factor 0.9999999999999999 AllocAtMost
// shrank its request by one byte per attempt, each emptying the cache
// (516,577 attempts in 20 s). Each step now takes at least 1/64 of the
// request: at most 65 attempts, and a result close to what is free.
func TestAllocAtMostBoundedSteps(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		cfg := core.ClassicConfig()
		cfg.OOMSizeFactor = 0.9999999999999999
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), cfg)
		held, err := a.Alloc(512*mib, 0)
		require.NoError(t, err)
		r := allocAtMostWithin(t, a, 1<<30, mib)
		require.NoError(t, r.err)
		st := a.Stats()
		require.LessOrEqual(t, st.NumAllocRetries, int64(65), "attempts that emptied the cache")
		require.Zero(t, st.NumOOMs, "only the final attempt counts an OOM")
		require.LessOrEqual(t, r.size, uint64(512*mib))
		require.GreaterOrEqual(t, r.size, uint64(400*mib), "within a step or two of the free memory")
		require.NoError(t, a.Free(r.ptr))
		require.NoError(t, a.Free(held))
	})
}

// AllocAtMost with a max far above the device (a TiB on a GiB) starts at
// the most there is room for: it used to shrink by a 64th of max a step,
// reach a step larger than what was free, and jump to min.
func TestAllocAtMostStartsAtTheRoom(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.DefaultConfig())
		for _, hi := range []uint64{2 << 30, 64 << 30, 1 << 40, 1 << 62} {
			r := allocAtMostWithin(t, a, hi, 1)
			require.NoError(t, r.err)
			require.GreaterOrEqual(t, r.size, uint64(900*mib), "max %d on a 1 GiB device", hi)
			require.LessOrEqual(t, r.size, uint64(1<<30))
			require.NoError(t, a.Free(r.ptr))
		}
		a = newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.DefaultConfig())
		held, err := a.Alloc(300*mib, 0)
		require.NoError(t, err)
		a.SetMemoryLimit(600 * mib)
		r := allocAtMostWithin(t, a, 1<<40, 1)
		require.NoError(t, r.err)
		require.GreaterOrEqual(t, r.size, uint64(250*mib), "the limit leaves about 300 MiB")
		require.LessOrEqual(t, r.size, uint64(300*mib))
		require.NoError(t, a.Free(r.ptr))
		require.NoError(t, a.Free(held))
	})
}

// A driver that cannot say how much is free leaves AllocAtMost where it
// was: it starts at max and shrinks.
func TestAllocAtMostWithoutMemInfo(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		f := vmmtest.NewFaulty(vmmtest.HostDriver(t, 1<<30))
		a := newAlloc(t, k, f, core.DefaultConfig())
		n := f.Calls(vmmtest.OpMemInfo)
		f.FailNth(vmmtest.OpMemInfo, 1, nil)
		r := allocAtMostWithin(t, a, 2<<30, mib)
		require.NoError(t, r.err)
		require.Greater(t, f.Calls(vmmtest.OpMemInfo), n, "AllocAtMost asked the driver")
		require.GreaterOrEqual(t, r.size, uint64(mib))
		require.LessOrEqual(t, r.size, uint64(1<<30))
		require.NoError(t, a.Free(r.ptr))
	})
}

type atMost struct {
	ptr  vmm.DevicePtr
	size uint64
	err  error
}

// allocAtMostWithin runs AllocAtMost(hi, lo) on the default stream and
// fails the test if it takes over 10 s. A test that fails leaves it
// running until the allocator's Close makes it return.
func allocAtMostWithin(t *testing.T, a allocator, hi, lo uint64) atMost {
	t.Helper()
	done := make(chan atMost, 1)
	go func() {
		p, n, err := a.AllocAtMost(hi, lo, 0)
		done <- atMost{p, n, err}
	}()
	select {
	case r := <-done:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("AllocAtMost still shrinking after 10 s: %d attempts", a.Stats().NumAllocRetries)
		return atMost{}
	}
}

// Issue 15 item 5: a minimum below every step still ends at the minimum,
// and fails there with the whole OOM policy.
func TestAllocAtMostBoundedStepsFails(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		cfg := core.ClassicConfig()
		cfg.OOMSizeFactor = 0.9999999999999999
		a := newAlloc(t, k, vmmtest.HostDriver(t, 256*mib), cfg)
		held, err := a.Alloc(240*mib, 0)
		require.NoError(t, err)
		r := allocAtMostWithin(t, a, 256*mib, 100*mib)
		require.ErrorIs(t, r.err, vmm.ErrOutOfMemory)
		st := a.Stats()
		require.Equal(t, int64(1), st.NumOOMs)
		require.LessOrEqual(t, st.NumAllocRetries, int64(65))
		require.NoError(t, a.Free(held))
	})
}

// Issue 15 item 6: Alloc and RecordStream took any stream handle; after an
// allocation on stream 0xdeadbeef every EmptyCache failed. An unknown
// stream is now vmm.ErrInvalid and changes nothing.
func TestUnknownStreamRefused(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		const bad = vmm.Stream(0xdeadbeef)
		_, err := a.Alloc(mib, bad)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		_, _, err = a.AllocAtMost(64*mib, mib, bad)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		p, err := a.Alloc(mib, 0)
		require.NoError(t, err)
		require.ErrorIs(t, a.RecordStream(p, bad), vmm.ErrInvalid)
		require.NoError(t, a.Free(p))
		require.NoError(t, a.EmptyCache())
		st := a.Stats()
		require.Zero(t, st.ReservedBytes.All.Current)
		require.Zero(t, st.Segments.All.Current)
	})
}

// Issue 15 item 6: a live stream is checked once, then remembered; a
// stream destroyed and found so is checked again and refused.
func TestStreamCheckedOnce(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		d := vmmtest.HostDriver(t, 1<<30)
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		a := newAlloc(t, k, d, core.ClassicConfig())
		for range 3 {
			p, err := a.Alloc(mib, s)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
		}
		require.NoError(t, d.StreamDestroy(s))
		require.NoError(t, a.EmptyCache(), "the stream's segment is given back after a device sync")
		_, err = a.Alloc(mib, s)
		require.ErrorIs(t, err, vmm.ErrInvalid, "found destroyed: checked again")
		// Said once, with the driver's reason (a stream of another device
		// is live, so the allocator's own words must not say "not live").
		require.ErrorContains(t, err, fmt.Sprintf("stream %#x cannot be used on device 0: ", uintptr(s)))
		require.Equal(t, 1, strings.Count(err.Error(), "not live"), "%v", err)
	})
}

// Issue 15 item 6: after the stream a block was recorded on was destroyed,
// Free failed forever ("stream 0x1 is not live"). Its work is done once the
// device is: the block is freed and reused.
func TestFreeAfterRecordedStreamDestroyed(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		d := vmmtest.HostDriver(t, 1<<30)
		s1, err := d.StreamCreate(0)
		require.NoError(t, err)
		s2, err := d.StreamCreate(0)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, d.StreamDestroy(s2)) })
		a := newAlloc(t, k, d, core.ClassicConfig())
		p, err := a.Alloc(4*mib, 0)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, s1))
		require.NoError(t, a.RecordStream(p, s2))
		require.NoError(t, d.StreamDestroy(s1))
		syncs := a.Stats().Syncs
		require.NoError(t, a.Free(p))
		st := a.Stats()
		require.Greater(t, st.Syncs, syncs, "the destroyed stream's work was waited for")
		require.Zero(t, st.AllocatedBytes.All.Current)
		q, err := a.Alloc(4*mib, 0)
		require.NoError(t, err)
		require.Equal(t, p, q, "s2's event has completed: the block is reused")
		require.NoError(t, a.Free(q))

		// Every stream gone: the block is free at once.
		p, err = a.Alloc(4*mib, 0)
		require.NoError(t, err)
		s3, err := d.StreamCreate(0)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, s3))
		require.NoError(t, d.StreamDestroy(s3))
		require.NoError(t, a.Free(p))
		require.Zero(t, a.Stats().ActiveBytes.All.Current)
		require.NoError(t, a.EmptyCache())
		require.Zero(t, a.Stats().ReservedBytes.All.Current)
	})
}

// Issue 15 item 6: a free deferred while a pool is active records its
// events when the pool ends; a stream destroyed meanwhile does not keep
// the block pending forever.
func TestDeferredFreeAfterStreamDestroyed(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		d := vmmtest.HostDriver(t, 1<<30)
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		a := newAlloc(t, k, d, core.ClassicConfig())
		p, err := a.Alloc(4*mib, 0)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, s))
		id := core.PoolID{First: 1, Second: 1}
		require.NoError(t, a.BeginAllocateToPool(id, nil))
		require.NoError(t, a.Free(p))
		require.NoError(t, d.StreamDestroy(s))
		require.NoError(t, a.EndAllocateToPool(id))
		require.NoError(t, a.ReleasePool(id))
		require.Zero(t, a.Stats().ActiveBytes.All.Current, "freed once the pool ended")
		require.NoError(t, a.EmptyCache())
	})
}

// Issue 15 item 9: Stats after Close reported the pages Close had just
// released (80 MiB) as reserved while the driver held nothing.
func TestStatsAfterCloseZero(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		d := vmmtest.HostDriver(t, 1<<30)
		a := newAlloc(t, k, d, core.ClassicConfig())
		p, err := a.Alloc(80*mib, 0)
		require.NoError(t, err)
		q, err := a.Alloc(mib, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(q))
		_ = p // still allocated at Close
		require.NoError(t, a.Close())
		st := a.Stats()
		for _, s := range []core.Stat{st.ReservedBytes.All, st.ReservedBytes.Small, st.ReservedBytes.Large, st.Segments.All, st.Segments.Small, st.Segments.Large} {
			require.Zero(t, s.Current)
		}
		require.Greater(t, st.ReservedBytes.All.Peak, int64(80*mib), "peaks stay")
		require.Equal(t, vmm.Usage{}, d.Usage(), "the driver holds nothing")
	})
}

// Issue 15 item 10: Close did not wake an allocation sleeping in the OOM
// backoff; it slept on for the whole delay. It now returns vmm.ErrClosed
// at once.
func TestCloseWakesBackoff(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		cfg := core.ClassicConfig()
		cfg.OOMMaxRetries, cfg.OOMDelay = 5, 3*time.Second
		a := newAlloc(t, k, vmmtest.HostDriver(t, 256*mib), cfg)
		_, err := a.Alloc(200*mib, 0)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			_, err := a.Alloc(200*mib, 0)
			done <- err
		}()
		require.Eventually(t, func() bool { return a.Stats().NumAllocRetries >= 2 }, 5*time.Second, time.Millisecond,
			"the allocation sleeps in the backoff")
		time.Sleep(20 * time.Millisecond)
		start := time.Now()
		require.NoError(t, a.Close())
		select {
		case err := <-done:
			require.ErrorIs(t, err, vmm.ErrClosed)
			require.Less(t, time.Since(start), 500*time.Millisecond)
		case <-time.After(2 * time.Second):
			t.Fatal("the allocation still sleeps 2 s after Close")
		}
	})
}
