package expandable

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestStatsTimes: the time the allocator spends in page work and in
// waits shows in Stats.PageNanos and SyncNanos, and ResetAccumulatedStats
// zeroes both.
func TestStatsTimes(t *testing.T) {
	const delay = 3 * time.Millisecond
	slow := vmmtest.WhenFunc(func(vmmtest.Call) bool { time.Sleep(delay); return false })
	f := vmmtest.NewFaulty(vmmtest.HostDriver(t, 1<<30))
	a := newAlloc(t, f, DefaultConfig())
	s2, err := f.StreamCreate(0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.StreamDestroy(s2)) })

	st := a.Stats()
	require.Zero(t, st.PageNanos)
	require.Zero(t, st.SyncNanos)

	// Each physical allocation made costs at least the delay.
	f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpCreate), When: slow})
	p, err := a.Alloc(8<<20, 0)
	require.NoError(t, err)
	st = a.Stats()
	require.Positive(t, st.PagesCreated)
	require.GreaterOrEqual(t, st.PageNanos, st.PagesCreated*int64(delay))
	require.Zero(t, st.SyncNanos, "no wait yet")
	require.Zero(t, st.Syncs)

	// A block used on another stream is freed pending its event;
	// emptying the cache waits for it.
	f.Reset()
	f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpEventSynchronize, vmmtest.OpStreamSynchronize, vmmtest.OpDeviceSynchronize), When: slow})
	require.NoError(t, a.RecordStream(p, s2))
	require.NoError(t, a.Free(p))
	before := a.Stats().PageNanos
	require.NoError(t, a.EmptyCache())
	st = a.Stats()
	require.Positive(t, st.Syncs)
	require.GreaterOrEqual(t, st.SyncNanos, st.Syncs*int64(delay), "each wait took the delay")
	require.Greater(t, st.PageNanos, before, "unmapping and releasing the pages is page work")

	a.ResetAccumulatedStats()
	st = a.Stats()
	require.Zero(t, st.PageNanos)
	require.Zero(t, st.SyncNanos)
	require.Zero(t, st.Syncs)
}
