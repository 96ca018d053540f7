package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// marksScene: under recycle_pages, a 40 MiB block freed long ago, and
// 200 allocations and frees of distinct sizes in a small free region
// between two fences after it (the slow path records stream marks).
// Returns a function that frees the fences.
func marksScene(t *testing.T, a *Allocator) func() {
	t.Helper()
	old, err := a.Alloc(40*mib, 0)
	require.NoError(t, err)
	fence, err := a.Alloc(2*mib, 0)
	require.NoError(t, err)
	room, err := a.Alloc(4*mib, 0)
	require.NoError(t, err)
	fence2, err := a.Alloc(2*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(old))
	require.NoError(t, a.Free(room))
	for i := range 200 {
		p, err := a.Alloc(mib+uint64(i)*512, 0)
		require.NoError(t, err)
		require.True(t, p >= room && p < room.Add(4*mib), "the churn stays in its room")
		require.NoError(t, a.Free(p))
	}
	// The room and fence2 make one free block before the end: a growth
	// starts there and takes 18 pages, which the old block has.
	require.NoError(t, a.Free(fence2))
	return func() { require.NoError(t, a.Free(fence)) }
}

// TestStreamMarks: a growth that recycles the pages of a block freed
// before a stream mark that has completed unmaps them without waiting for
// the stream; while the marks are incomplete (the stream still busy) it
// retires them (retire.go), and waits for nothing either. (A chunk freed
// after the last mark is waited for: the chunk split of
// TestChunkSplitOnCarve.)
func TestStreamMarks(t *testing.T) {
	for _, busy := range []bool{false, true} {
		g := &vmmtest.CaptureGuard{Driver: vmmtest.HostDriver(t, 1<<30)}
		g.Hold.Store(busy)
		a := newAlloc(t, g, recycleConfig(true))
		freeFences := marksScene(t, a)
		before := a.Stats()
		big, err := a.Alloc(42*mib, 0)
		require.NoError(t, err)
		st := a.Stats()
		require.LessOrEqual(t, st.ReservedBytes.All.Peak, int64(70*mib), "busy %v: recycled, not grown", busy)
		require.Equal(t, before.Syncs, st.Syncs, "busy %v: no wait", busy)
		if busy {
			require.Equal(t, before.Unmaps, st.Unmaps, "marks incomplete: nothing unmapped yet")
			require.Greater(t, st.PagesRetired, before.PagesRetired, "marks incomplete: the old block's pages are retired")
		} else {
			require.Greater(t, st.Unmaps, before.Unmaps, "freed before a completed mark: the old block's pages are unmapped")
			require.Equal(t, before.PagesRetired, st.PagesRetired)
		}
		require.NoError(t, a.Free(big))
		freeFences()
		require.NoError(t, a.EmptyCache())
		u := g.Usage()
		require.Zero(t, u.Events, "busy %v: EmptyCache destroys the marks' events", busy)
		require.Zero(t, u.Mappings, "busy %v: EmptyCache unmaps the retired pages", busy)
		require.Zero(t, u.Handles, "busy %v: and releases them", busy)
	}
}

// TestStreamMarksFaults: when recording or querying a mark fails, the
// growth retires the pages (the stream might be busy) and the Heap waits
// for the stream before it unmaps them, at Close; nothing leaks.
func TestStreamMarksFaults(t *testing.T) {
	for _, op := range []vmmtest.Op{vmmtest.OpEventCreate, vmmtest.OpEventRecord, vmmtest.OpEventQuery} {
		host := vmmtest.HostDriver(t, 1<<30)
		f := vmmtest.NewFaulty(host, vmmtest.Injector{Where: vmmtest.Ops(op), When: vmmtest.Always()})
		a, err := New(f, 0, recycleConfig(true), nil)
		require.NoError(t, err)
		freeFences := marksScene(t, a)
		before := a.Stats()
		big, err := a.Alloc(42*mib, 0)
		require.NoError(t, err, "%s failing", op)
		st := a.Stats()
		require.Greater(t, st.PagesRetired, before.PagesRetired, "%s failing: retired", op)
		require.Equal(t, before.Syncs, st.Syncs, "%s failing: no wait yet", op)
		require.NoError(t, a.Free(big))
		freeFences()
		require.NoError(t, a.Close())
		u := host.Usage()
		require.Zero(t, u.Events, "%s failing", op)
		require.Zero(t, u.Handles)
		require.Zero(t, u.Mappings)
	}
}

// TestStreamMarksAskSeldom: while a mark stays in flight (the stream
// busy), the slow path asks the driver about it once every 64 frees at
// most, not at every allocation.
func TestStreamMarksAskSeldom(t *testing.T) {
	g := &vmmtest.CaptureGuard{Driver: vmmtest.HostDriver(t, 1<<30)}
	g.Hold.Store(true)
	f := vmmtest.NewFaulty(g)
	a := newAlloc(t, f, recycleConfig(true))
	freeFences := marksScene(t, a) // 202 frees, 200 of them after a slow-path allocation
	queries, records := f.Calls(vmmtest.OpEventQuery), f.Calls(vmmtest.OpEventRecord)
	require.LessOrEqual(t, queries, 202/64, "queries of the mark in flight")
	require.GreaterOrEqual(t, queries, 1, "the mark in flight is asked about")
	require.Equal(t, 1, records, "one mark, never seen complete")
	freeFences()
}
