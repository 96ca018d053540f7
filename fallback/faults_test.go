package fallback

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// faulty wraps a leak-checked host driver in the fault injector.
func faulty(t *testing.T, capacity uint64) *vmmtest.Faulty {
	return vmmtest.NewFaulty(vmmtest.HostDriver(t, capacity))
}

func TestMemAllocFailureChangesNothing(t *testing.T) {
	d := faulty(t, 1<<30)
	a := newAlloc(t, d, DefaultConfig())
	d.FailNth(vmmtest.OpMemAlloc, 1, vmmtest.ErrInjected)
	_, err := a.Alloc(3*mib, 0)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.NotErrorIs(t, err, vmm.ErrOutOfMemory)
	require.ErrorContains(t, err, "allocating a 20971520-byte segment")
	st := a.Stats()
	require.Zero(t, st.NumAllocRetries, "not an OOM: no retry")
	require.Zero(t, st.Segments.All.Current)
	require.Zero(t, st.ReservedBytes.All.Current)
	require.Zero(t, st.AllocatedBytes.All.Current)
	require.Zero(t, d.Usage().Allocs)
	p, err := a.Alloc(3*mib, 0)
	require.NoError(t, err, "the allocator works after the failure")
	require.NoError(t, a.Free(p))
}

// TestMemAllocOOMIsRetried: an OOM from MemAlloc runs the OOM policy,
// whose retry succeeds.
func TestMemAllocOOMIsRetried(t *testing.T) {
	d := faulty(t, 1<<30)
	a := newAlloc(t, d, DefaultConfig())
	d.FailNth(vmmtest.OpMemAlloc, 1, nil)
	p, err := a.Alloc(3*mib, 0)
	require.NoError(t, err)
	st := a.Stats()
	require.Equal(t, int64(1), st.NumAllocRetries)
	require.Zero(t, st.NumOOMs)
	require.Equal(t, 2, d.Calls(vmmtest.OpMemAlloc))
	require.NoError(t, a.Free(p))

	d.FailNth(vmmtest.OpMemAlloc, 1, nil)
	d.FailNth(vmmtest.OpMemAlloc, 2, nil)
	_, err = a.Alloc(30*mib, 0)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.ErrorContains(t, err, "after 1 retry")
	require.Equal(t, int64(1), a.Stats().NumOOMs)
}

// TestMemFreeFailureKeepsSegment: a segment whose MemFree fails stays, in
// the books and usable, and goes at the next EmptyCache.
func TestMemFreeFailureKeepsSegment(t *testing.T) {
	d := faulty(t, 1<<30)
	a := newAlloc(t, d, DefaultConfig())
	p, err := a.Alloc(3*mib, 0)
	require.NoError(t, err)
	q, err := a.Alloc(40*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Free(q))
	d.FailNth(vmmtest.OpMemFree, 1, vmmtest.ErrInjected)
	err = a.EmptyCache()
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.ErrorContains(t, err, "freeing the")
	require.Equal(t, 1, d.Usage().Allocs, "the other segment was freed")
	st := a.Stats()
	require.Equal(t, int64(1), st.Segments.All.Current)
	require.Equal(t, int64(d.Usage().AllocBytes), st.ReservedBytes.All.Current)
	snap := a.Snapshot()
	require.Len(t, snap.Segments, 1)
	again, err := a.Alloc(snap.Segments[0].Reserved, 0)
	require.NoError(t, err)
	require.Equal(t, snap.Segments[0].Base, again, "the kept segment serves requests")
	require.NoError(t, a.Free(again))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, d.Usage().Allocs)
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
}

// TestMemFreeFailureOnClose: Close reports a segment it could not free and
// keeps it; a later Close frees it and then returns nil.
func TestMemFreeFailureOnClose(t *testing.T) {
	d := faulty(t, 1<<30)
	a, err := New(d, 0, DefaultConfig(), nil)
	require.NoError(t, err)
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	base := a.Snapshot().Segments[0].Base
	require.Equal(t, p, base)
	d.FailNth(vmmtest.OpMemFree, 1, vmmtest.ErrInjected)
	err = a.Close()
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.Equal(t, 1, d.Usage().Allocs, "kept")
	_, err = a.Alloc(1, 0)
	require.ErrorIs(t, err, vmm.ErrClosed)
	require.NoError(t, a.Close(), "tries again")
	require.Zero(t, d.Usage().Allocs)
	require.NoError(t, a.Close(), "nothing left")
}

// TestFaultSweep fails each MemAlloc and each MemFree of a workload in
// turn: every failure is reported, the books stay consistent (checked
// after every operation with -tags invariants) and nothing leaks.
func TestFaultSweep(t *testing.T) {
	sizes := []uint64{4096, 700 << 10, 3 * mib, 12 * mib, 5 * mib, 64 * mib, 100}
	workload := func(a *Allocator) (failures int) {
		var live []vmm.DevicePtr
		for i, s := range sizes {
			p, err := a.Alloc(s, 0)
			if err != nil {
				failures++
				continue
			}
			live = append(live, p)
			if i%2 == 1 {
				require.NoError(t, a.Free(live[0]))
				live = live[1:]
			}
		}
		for _, p := range live {
			require.NoError(t, a.Free(p))
		}
		if err := a.EmptyCache(); err != nil {
			failures++
			require.NoError(t, a.EmptyCache(), "a second EmptyCache frees what the first kept")
		}
		require.Zero(t, a.Stats().ReservedBytes.All.Current)
		return failures
	}
	for _, op := range []vmmtest.Op{vmmtest.OpMemAlloc, vmmtest.OpMemFree} {
		for n := 1; ; n++ {
			d := faulty(t, 1<<30)
			a := newAlloc(t, d, DefaultConfig())
			d.FailNth(op, n, vmmtest.ErrInjected)
			failures := workload(a)
			if d.Calls(op) < n {
				require.Zero(t, failures)
				require.Greater(t, n, 3, "the workload makes several %s calls", op)
				break
			}
			require.Equal(t, 1, failures, "%s call %d failed once", op, n)
			require.Zero(t, d.Usage().Allocs, "%s call %d: segments left", op, n)
		}
	}
}
