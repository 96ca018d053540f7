package fallback

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestEmptyCacheReleasesWholeFreeSegments: EmptyCache frees the segments
// with nothing allocated and keeps the others, contents intact.
func TestEmptyCacheReleasesWholeFreeSegments(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, DefaultConfig())
	keep, err := a.Alloc(3*mib, 0)
	require.NoError(t, err)
	rest, err := a.Alloc(3*mib, 0) // same 20 MiB segment
	require.NoError(t, err)
	big, err := a.Alloc(40*mib, 0) // its own segment
	require.NoError(t, err)
	small, err := a.Alloc(4096, 0) // a small segment
	require.NoError(t, err)
	data := []byte("still here after EmptyCache")
	require.NoError(t, d.CopyHtoD(keep, data))
	for _, p := range []vmm.DevicePtr{rest, big, small} {
		require.NoError(t, a.Free(p))
	}
	require.Equal(t, 3, d.Usage().Allocs)
	require.NoError(t, a.EmptyCache())
	u := d.Usage()
	require.Equal(t, 1, u.Allocs, "only the segment with a live block stays")
	require.Equal(t, uint64(20*mib), u.AllocBytes)
	st := a.Stats()
	require.Equal(t, int64(20*mib), st.ReservedBytes.All.Current)
	require.Equal(t, int64(2), st.Unmaps, "two segments freed")
	require.Equal(t, int64(1), st.Segments.All.Current)
	got := make([]byte, len(data))
	require.NoError(t, d.CopyDtoH(got, keep))
	require.Equal(t, data, got)
	require.NoError(t, a.Free(keep))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, d.Usage().Allocs)
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
}

// TestOOMReleasesOtherStreamsSegments: a free segment cached for another
// stream is given back when the device runs out, and the request is met.
func TestOOMReleasesOtherStreamsSegments(t *testing.T) {
	d := vmmtest.HostDriver(t, 100*mib)
	a := newAlloc(t, d, DefaultConfig())
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	defer func() {
		require.NoError(t, a.Close())
		require.NoError(t, d.StreamDestroy(s))
	}()
	p, err := a.Alloc(80*mib, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(p)) // an 80 MiB segment cached on stream s
	q, err := a.Alloc(60*mib, 0)  // fits only once s's segment is freed
	require.NoError(t, err)
	st := a.Stats()
	require.Equal(t, int64(1), st.NumAllocRetries)
	require.Zero(t, st.NumOOMs)
	require.Equal(t, int64(60*mib), st.ReservedBytes.All.Current)
	require.Equal(t, 1, d.Usage().Allocs)
	require.NoError(t, a.Free(q))
}

func TestOOMErrorSaysWhat(t *testing.T) {
	d := vmmtest.HostDriver(t, 100*mib)
	cfg := DefaultConfig()
	cfg.OOMMaxRetries = 2
	cfg.OOMDelay = time.Millisecond
	a := newAlloc(t, d, cfg)
	p, err := a.Alloc(60*mib, 0)
	require.NoError(t, err)
	_, err = a.Alloc(60*mib, 0)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	for _, want := range []string{"allocating 62914560 bytes", "bytes free of 104857600", "reserves 62914560 bytes", "62914560 allocated", "after 3 retries"} {
		require.ErrorContains(t, err, want)
	}
	st := a.Stats()
	require.Equal(t, int64(1), st.NumOOMs)
	require.Equal(t, int64(3), st.NumAllocRetries)
	require.NoError(t, a.Free(p))
	_, n, err := a.AllocAtMost(200*mib, 10*mib, 0)
	require.NoError(t, err)
	require.LessOrEqual(t, n, uint64(100*mib))
	require.GreaterOrEqual(t, n, uint64(10*mib))
}

// TestReleaseThreshold: Free gives wholly free segments back once the free
// reserved bytes pass the threshold.
func TestReleaseThreshold(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg := DefaultConfig()
	cfg.ReleaseThreshold = 30 * mib
	a := newAlloc(t, d, cfg)
	require.Equal(t, uint64(30*mib), a.Config().ReleaseThreshold)
	var ps []vmm.DevicePtr
	for range 5 {
		p, err := a.Alloc(12*mib, 0) // a 12 MiB segment each
		require.NoError(t, err)
		ps = append(ps, p)
	}
	require.NoError(t, a.Free(ps[0]))
	require.NoError(t, a.Free(ps[1]))
	require.Equal(t, 5, d.Usage().Allocs, "24 MiB free: under the threshold")
	require.NoError(t, a.Free(ps[2]))
	require.Equal(t, 2, d.Usage().Allocs, "36 MiB free: the three free segments go back")
	require.Equal(t, int64(24*mib), a.Stats().ReservedBytes.All.Current)
	require.NoError(t, a.Free(ps[3]))
	require.NoError(t, a.Free(ps[4]))
	require.Equal(t, 2, d.Usage().Allocs, "24 MiB free again: kept")
}

// TestReleaseThresholdFragmented: free memory in partly used segments,
// which no release can give back, raises the bar for the next release, so
// that not every Free runs one; wholly free segments still go back.
func TestReleaseThresholdFragmented(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg := DefaultConfig()
	cfg.ReleaseThreshold = 10 * mib
	a := newAlloc(t, d, cfg)
	var pins, ps []vmm.DevicePtr
	for range 3 { // three 20 MiB segments, each pinned by a small block in the middle
		for _, size := range []uint64{5 * mib, 1*mib + 512, 13 * mib} {
			p, err := a.Alloc(size, 0)
			require.NoError(t, err)
			if size == 1*mib+512 {
				pins = append(pins, p)
			} else {
				ps = append(ps, p)
			}
		}
	}
	require.Equal(t, 3, d.Usage().Allocs)
	for _, p := range ps {
		require.NoError(t, a.Free(p))
	}
	require.Equal(t, 3, d.Usage().Allocs, "no segment is wholly free")
	floor := a.heap.ReleaseFloor()
	free := uint64(3*20*mib - 3*(1*mib+512))
	require.Equal(t, free-10*mib, floor, "what the release left above the threshold")
	for i, p := range pins {
		require.NoError(t, a.Free(p))
		require.Equal(t, 2-i, d.Usage().Allocs, "a wholly free segment goes back")
	}
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
}
