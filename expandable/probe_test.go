package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestProbePendingPause(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	s, err := e.host.StreamCreate(0)
	require.NoError(t, err)
	defer e.host.StreamDestroy(s)
	bs := e.allocTagged(4096, 3*mib, 30*mib)
	require.NoError(t, e.a.RecordStream(bs[1].ptr, s))
	require.NoError(t, e.a.Free(bs[1].ptr))
	require.NoError(t, e.a.Pause(true))
	ts, _ := e.a.TagStats(tagName)
	t.Logf("%+v", ts)
	st := e.a.Stats()
	t.Log(st.ReservedBytes.All.Current, st.ActiveBytes.All.Current)
	p, err := e.a.Alloc(1*mib, 0)
	require.NoError(t, err)
	require.NoError(t, e.a.Free(p))
	require.NoError(t, e.a.EmptyCache())
	e.reservedIsHeld()
	require.NoError(t, e.a.Resume())
	e.reservedIsHeld()
	require.NoError(t, e.intact([]block{bs[0], bs[2]}))
}

func TestProbePausedStreamFree(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	s, err := e.host.StreamCreate(0)
	require.NoError(t, err)
	bs := e.allocTagged(4096, 3*mib, 30*mib)
	require.NoError(t, e.a.RecordStream(bs[1].ptr, s))
	require.NoError(t, e.a.Pause(true))
	require.NoError(t, e.a.Free(bs[1].ptr))
	require.NoError(t, e.host.StreamDestroy(s))
	p, err := e.a.Alloc(1*mib, 0)
	require.NoError(t, err)
	require.NoError(t, e.a.Free(p))
	require.NoError(t, e.a.EmptyCache())
	e.reservedIsHeld()
	require.NoError(t, e.a.Resume())
	e.reservedIsHeld()
	require.NoError(t, e.intact([]block{bs[0], bs[2]}))
	t.Log(e.a.Snapshot())
}

func TestProbePauseAllThenNewTag(t *testing.T) {
	e := newPaused(t, DefaultConfig())
	e.allocTagged(4096, 3*mib)
	require.NoError(t, e.a.SetMemoryFraction(0.5))
	require.NoError(t, e.a.Pause(false))
	// allocate lots in shared pool
	p, err := e.a.Alloc(100*mib, 0)
	require.NoError(t, err)
	t.Log(e.a.Resume())
	require.NoError(t, e.a.Free(p))
	t.Log(e.a.Resume())
	e.reservedIsHeld()
}
