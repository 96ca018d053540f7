package core_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// ev is the part of a history event that tests compare.
type ev struct {
	action string
	addr   vmm.DevicePtr
	size   uint64
}

func evs(h []core.HistoryEvent) []ev {
	out := make([]ev, len(h))
	for i, e := range h {
		out[i] = ev{e.Action, e.Addr, e.Size}
	}
	return out
}

func actions(h []core.HistoryEvent) []string {
	out := make([]string, len(h))
	for i, e := range h {
		out[i] = e.Action
	}
	return out
}

// since returns the events after the first n.
func since(a allocator, n int) []core.HistoryEvent { return a.History()[n:] }

func TestHistoryOff(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		p, err := a.Alloc(1000, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		require.Nil(t, a.History())
		require.NoError(t, a.RecordHistory(10))
		require.Empty(t, a.History(), "only what happens from now on")
		p, err = a.Alloc(1000, 0)
		require.NoError(t, err)
		require.NotEmpty(t, a.History())
		require.NoError(t, a.RecordHistory(0))
		require.Nil(t, a.History(), "off drops the events")
		require.NoError(t, a.Free(p))
		require.Nil(t, a.History())
	})
}

// TestHistoryAllocFree: a block's life and its segment's, in order, with
// PyTorch's action names.
func TestHistoryAllocFree(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		require.NoError(t, a.RecordHistory(100))
		before := time.Now().UnixMicro()
		p, err := a.Alloc(1000, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		require.NoError(t, a.EmptyCache())
		h := a.History()
		require.Equal(t, []ev{
			{k.made, p, 2 * mib}, // the small pool's page or segment
			{core.ActionAlloc, p, 1024},
			{core.ActionFreeRequested, p, 1024},
			{core.ActionFreeCompleted, p, 1024},
			{k.gone, p, 2 * mib},
		}, evs(h))
		for i, e := range h {
			require.Zero(t, e.Stream)
			require.True(t, e.Pool.IsZero())
			require.Zero(t, e.DeviceFree)
			require.GreaterOrEqual(t, e.TimeUS, before)
			require.LessOrEqual(t, e.TimeUS, time.Now().UnixMicro())
			if i > 0 {
				require.GreaterOrEqual(t, e.TimeUS, h[i-1].TimeUS)
			}
		}
	})
}

// TestHistoryRecordedStream: a block used on another stream completes its
// free only once that stream's work has.
func TestHistoryRecordedStream(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		hd := vmmtest.HostDriver(t, 1<<30)
		g := &vmmtest.CaptureGuard{Driver: hd}
		s, err := hd.StreamCreate(0)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, hd.StreamDestroy(s)) })
		a := newAlloc(t, k, g, core.ClassicConfig())
		require.NoError(t, a.RecordHistory(100))
		p, err := a.Alloc(1000, s)
		require.NoError(t, err)
		require.NoError(t, a.RecordStream(p, 0))
		g.Hold.Store(true) // stream 0's work is not done
		require.NoError(t, a.Free(p))
		n := len(a.History())
		require.Equal(t, core.ActionFreeRequested, a.History()[n-1].Action, "not completed yet")
		q, err := a.Alloc(1000, s)
		require.NoError(t, err)
		require.NotEqual(t, p, q, "p is still in use")
		require.Equal(t, []ev{{core.ActionAlloc, q, 1024}}, evs(since(a, n)))
		require.Equal(t, s, a.History()[n].Stream, "the block's stream")

		g.Hold.Store(false)
		require.NoError(t, a.Free(q))
		r, err := a.Alloc(1000, s)
		require.NoError(t, err)
		require.Equal(t, []ev{
			{core.ActionAlloc, q, 1024},
			{core.ActionFreeRequested, q, 1024},
			{core.ActionFreeCompleted, q, 1024}, // no other stream: at once
			{core.ActionFreeCompleted, p, 1024}, // its event completed
			{core.ActionAlloc, r, 1024},
		}, evs(since(a, n)))
		require.NoError(t, a.Free(r))
	})
}

// TestHistoryOOM: out-of-memory errors are recorded with the request and
// the device's free memory, and no memory made for them.
func TestHistoryOOM(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 100*mib), core.ClassicConfig())
		require.NoError(t, a.RecordHistory(100))
		p, err := a.Alloc(60*mib, 0)
		require.NoError(t, err)
		n := len(a.History())
		_, err = a.Alloc(60*mib, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		_, err = a.Alloc(200*mib, 0) // more than the device has
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		a.SetMemoryLimit(70 * mib)
		_, err = a.Alloc(20*mib, 0) // past the limit
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		h := since(a, n)
		require.Equal(t, []ev{
			{core.ActionOOM, 0, 60 * mib},
			{core.ActionOOM, 0, 200 * mib},
			{core.ActionOOM, 0, 20 * mib},
		}, evs(h))
		for _, e := range h {
			require.Equal(t, uint64(40*mib), e.DeviceFree)
		}
		_, _, err = a.AllocAtMost(200*mib, 30*mib, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		require.Equal(t, []string{core.ActionOOM}, actions(since(a, n+3)), "only the final attempt is an OOM")
		require.NoError(t, a.Free(p))
	})
}

// TestHistoryRing: the history keeps the newest events; a new bound keeps
// those it has; bad bounds change nothing.
func TestHistoryRing(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		require.NoError(t, a.RecordHistory(1000))
		cycle := func() vmm.DevicePtr {
			p, err := a.Alloc(1000, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			return p
		}
		for range 10 {
			cycle()
		}
		full := a.History()
		require.Len(t, full, 31)
		require.NoError(t, a.RecordHistory(5))
		require.Equal(t, full[26:], a.History(), "the newest five stay")
		p := cycle()
		h := a.History()
		require.Len(t, h, 5)
		require.Equal(t, full[29:], h[:2])
		require.Equal(t, []ev{{core.ActionAlloc, p, 1024}, {core.ActionFreeRequested, p, 1024}, {core.ActionFreeCompleted, p, 1024}}, evs(h[2:]))
		for range 7 { // wrap around more than once
			cycle()
		}
		require.Equal(t, []string{core.ActionFreeRequested, core.ActionFreeCompleted, core.ActionAlloc, core.ActionFreeRequested, core.ActionFreeCompleted},
			actions(a.History()), "the newest five, oldest first")

		require.ErrorIs(t, a.RecordHistory(-1), vmm.ErrInvalid)
		require.ErrorIs(t, a.RecordHistory(core.MaxHistoryEntries+1), vmm.ErrInvalid)
		require.Len(t, a.History(), 5, "unchanged")
		require.NoError(t, a.RecordHistory(core.MaxHistoryEntries), "the bound allocates nothing up front")
		require.Len(t, a.History(), 5)
	})
}

// TestHistoryUnmaps: memory given back outside EmptyCache is recorded
// too: by the release threshold, by a released private pool and, for the
// expandable allocator, by pages stolen for growth elsewhere.
func TestHistoryUnmaps(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		t.Run("ReleaseThreshold", func(t *testing.T) {
			cfg := core.ClassicConfig()
			cfg.ReleaseThreshold = 1
			a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), cfg)
			require.NoError(t, a.RecordHistory(100))
			p, err := a.Alloc(40*mib, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			require.Equal(t, []ev{
				{k.made, p, 40 * mib},
				{core.ActionAlloc, p, 40 * mib},
				{core.ActionFreeRequested, p, 40 * mib},
				{core.ActionFreeCompleted, p, 40 * mib},
				{k.gone, p, 40 * mib},
			}, evs(a.History()))
		})
		t.Run("ReleasedPool", func(t *testing.T) {
			a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
			require.NoError(t, a.RecordHistory(100))
			id := core.PoolID{First: 1, Second: 2}
			require.NoError(t, a.RetainPool(id))
			p, err := a.AllocInPool(id, 1000, 0)
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			require.NoError(t, a.ReleasePool(id))
			h := a.History()
			require.Equal(t, []string{k.made, core.ActionAlloc, core.ActionFreeRequested, core.ActionFreeCompleted, k.gone}, actions(h))
			for _, e := range h {
				require.Equal(t, id, e.Pool, e.Action)
			}
		})
		if k.name != "expandable" {
			return
		}
		t.Run("Stolen", func(t *testing.T) {
			a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
			p, err := a.Alloc(20*mib, 0) // page 0
			require.NoError(t, err)
			q, err := a.Alloc(20*mib, 0) // page 1
			require.NoError(t, err)
			require.NoError(t, a.Free(p))
			require.NoError(t, a.RecordHistory(100))
			r, err := a.Alloc(40*mib, 0) // pages 2 and 3: page 0 moves there
			require.NoError(t, err)
			require.Equal(t, []ev{
				{core.ActionSegmentUnmap, p, 20 * mib},
				{core.ActionSegmentMap, r, 40 * mib},
				{core.ActionAlloc, r, 40 * mib},
			}, evs(a.History()))
			require.Equal(t, int64(1), a.Stats().PagesReused)
			require.NoError(t, a.Free(q))
			require.NoError(t, a.Free(r))
		})
	})
}

// TestHistoryFaults: a growth that fails in the driver records nothing
// and maps nothing; an out-of-memory retry that succeeds records one
// growth and no OOM.
func TestHistoryFaults(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		// makeOp makes memory and fails with an OOM by default; failOps
		// fail a growth with another error.
		makeOp, failOps := vmmtest.OpCreate, []vmmtest.Op{vmmtest.OpMap, vmmtest.OpSetAccess, vmmtest.OpCreate}
		if k.name == "fallback" {
			makeOp, failOps = vmmtest.OpMemAlloc, []vmmtest.Op{vmmtest.OpMemAlloc}
		}
		for _, op := range failOps {
			t.Run(string(op), func(t *testing.T) {
				hd := vmmtest.HostDriver(t, 1<<30)
				d := vmmtest.NewFaulty(hd)
				a := newAlloc(t, k, d, core.ClassicConfig())
				require.NoError(t, a.RecordHistory(100))
				d.FailNth(op, 1, vmmtest.ErrInjected)
				_, err := a.Alloc(30*mib, 0)
				require.ErrorIs(t, err, vmmtest.ErrInjected)
				require.Empty(t, a.History(), "no map, no alloc, no OOM")
				u := hd.Usage()
				require.Zero(t, u.MappedBytes)
				require.Zero(t, u.AllocBytes)
				require.Zero(t, a.Stats().AllocatedBytes.All.Current)
				p, err := a.Alloc(30*mib, 0)
				require.NoError(t, err, "works after the failure")
				require.Equal(t, []string{k.made, core.ActionAlloc}, actions(a.History()))
				require.NoError(t, a.Free(p))
			})
		}
		t.Run("OOMRetried", func(t *testing.T) {
			d := vmmtest.NewFaulty(vmmtest.HostDriver(t, 1<<30))
			a := newAlloc(t, k, d, core.ClassicConfig())
			require.NoError(t, a.RecordHistory(100))
			d.FailNth(makeOp, 1, nil)
			p, err := a.Alloc(30*mib, 0)
			require.NoError(t, err)
			require.Equal(t, int64(1), a.Stats().NumAllocRetries)
			require.Equal(t, []string{k.made, core.ActionAlloc}, actions(a.History()))
			require.NoError(t, a.Free(p))
			n := len(a.History())
			d.FailNth(makeOp, 1, nil)
			d.FailNth(makeOp, 2, nil)
			_, err = a.Alloc(100*mib, 0)
			require.ErrorIs(t, err, vmm.ErrOutOfMemory)
			require.Equal(t, []string{k.gone, core.ActionOOM}, actions(since(a, n)), "the policy emptied the cache, then failed")
		})
	})
}

// TestHistoryClose: Close records the memory it gives back; the history
// stays readable after it.
func TestHistoryClose(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		require.NoError(t, a.RecordHistory(100))
		p, err := a.Alloc(1000, 0)
		require.NoError(t, err)
		require.NoError(t, a.Close())
		require.Equal(t, []ev{{k.made, p, 2 * mib}, {core.ActionAlloc, p, 1024}, {k.gone, p, 2 * mib}}, evs(a.History()))
		require.ErrorIs(t, a.RecordHistory(10), vmm.ErrClosed)
	})
}

// TestHistoryConcurrent: recording, resizing and reading race with
// allocations (under -race); every history read is whole.
func TestHistoryConcurrent(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.ClassicConfig())
		known := []string{core.ActionAlloc, core.ActionFreeRequested, core.ActionFreeCompleted, k.made, k.gone, core.ActionOOM}
		stop := make(chan struct{})
		var reader sync.WaitGroup
		reader.Go(func() {
			bounds := []int{50, 0, 1000, 7}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				require.NoError(t, a.RecordHistory(bounds[i%len(bounds)]))
				h := a.History()
				require.LessOrEqual(t, len(h), 1000)
				for _, e := range h {
					require.True(t, slices.Contains(known, e.Action), e.Action)
				}
			}
		})
		var workers sync.WaitGroup
		for w := range 4 {
			workers.Go(func() {
				for i := range 500 {
					p, err := a.Alloc(uint64(1+w)*1000+uint64(i%5)*mib, 0)
					require.NoError(t, err)
					require.NoError(t, a.Free(p))
				}
			})
		}
		workers.Wait()
		close(stop)
		reader.Wait()
	})
}
