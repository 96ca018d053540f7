package expandable

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// retireScene: under recycle_pages with no page cache, a 40 MiB block is
// freed and a 60 MiB growth past a fence takes its 20 pages. Returns the
// old block's address, the fence and the grown block.
func retireScene(t *testing.T, a *Allocator) (old, fence, grown vmm.DevicePtr) {
	t.Helper()
	old, err := a.Alloc(40*mib, 0)
	require.NoError(t, err)
	fence, err = a.Alloc(2*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(old))
	grown, err = a.Alloc(60*mib, 0)
	require.NoError(t, err)
	return old, fence, grown
}

// livePages is the pages a's live blocks and cache hold mapped: reserved
// bytes over 2 MiB.
func livePages(a *Allocator) int {
	return int(a.Stats().ReservedBytes.All.Current / (2 * mib))
}

// TestRetiredPagesAlias: while the stream is busy, a growth takes the
// pages of a block of its stream freed since the last mark without
// waiting: they serve the grown block at once and stay mapped at their
// old addresses (the same bytes there), which work queued before the
// free may still read. A growth into the old addresses, still busy,
// waits for the stream first and unmaps them. Reserved counts each page
// once throughout.
func TestRetiredPagesAlias(t *testing.T) {
	g := &vmmtest.CaptureGuard{Driver: vmmtest.HostDriver(t, 1<<30)}
	g.Hold.Store(true)
	a := newAlloc(t, g, recycleConfig(true))
	old, fence, grown := retireScene(t, a)
	st := a.Stats()
	require.Equal(t, int64(20), st.PagesRetired, "the old block's 20 pages")
	require.Zero(t, st.Unmaps, "nothing unmapped yet")
	require.Zero(t, st.Syncs, "and nothing waited for")
	require.Equal(t, int64(62*mib), st.ReservedBytes.All.Peak, "recycled, not made anew")
	require.Equal(t, livePages(a)+20, g.Usage().Mappings, "the old addresses are still mapped")

	// Each page of the grown block has its own first byte; the 20 old
	// addresses show 20 of them.
	mark := map[byte]bool{}
	for i := range 30 {
		require.NoError(t, g.CopyHtoD(grown.Add(uint64(i)*2*mib), []byte{byte(i + 1)}))
		mark[byte(i+1)] = true
	}
	seen := map[byte]bool{}
	for i := range 20 {
		b := []byte{0}
		require.NoError(t, g.CopyDtoH(b, old.Add(uint64(i)*2*mib)))
		require.True(t, mark[b[0]], "old page %d shows a page of the grown block", i)
		seen[b[0]] = true
	}
	require.Len(t, seen, 20, "each a different one")

	// Growing into the old addresses while busy waits, then unmaps them.
	again, err := a.Alloc(30*mib, 0)
	require.NoError(t, err)
	require.Equal(t, old, again, "the lowest hole")
	st = a.Stats()
	require.Equal(t, int64(1), st.Syncs, "the stream is waited for before the old addresses are reused")
	require.Equal(t, int64(20), st.Unmaps, "the retired run goes whole")
	require.Equal(t, livePages(a), g.Usage().Mappings, "no old mapping left")
	b := []byte{0}
	require.NoError(t, g.CopyDtoH(b, grown))
	require.Equal(t, byte(1), b[0], "the grown block keeps its bytes")
	for _, p := range []vmm.DevicePtr{again, grown, fence} {
		require.NoError(t, a.Free(p))
	}
}

// TestRetiredPagesSweep: once the stream's mark passes the free, the slow
// path unmaps the retired pages without waiting.
func TestRetiredPagesSweep(t *testing.T) {
	g := &vmmtest.CaptureGuard{Driver: vmmtest.HostDriver(t, 1<<30)}
	a := newAlloc(t, g, recycleConfig(true))
	_, fence, grown := retireScene(t, a)
	require.Equal(t, int64(20), a.Stats().PagesRetired, "no mark yet: retired")
	require.Equal(t, livePages(a)+20, g.Usage().Mappings)
	// Allocations of new sizes take the slow path: it records a mark,
	// sees it complete 64 frees later and sweeps.
	for i := range 200 {
		p, err := a.Alloc(mib+uint64(i)*4096, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
	}
	st := a.Stats()
	require.Equal(t, int64(20), st.Unmaps, "swept")
	require.Zero(t, st.Syncs, "without a wait")
	require.Equal(t, livePages(a), g.Usage().Mappings)
	require.NoError(t, a.Free(grown))
	require.NoError(t, a.Free(fence))
}

// TestRetiredPagesOtherStream: pages of another stream's free block are
// not retired: the growth waits for that stream, whose work is not
// ordered before its own.
func TestRetiredPagesOtherStream(t *testing.T) {
	hd := vmmtest.HostDriver(t, 1<<30)
	s, err := hd.StreamCreate(0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, hd.StreamDestroy(s)) })
	g := &vmmtest.CaptureGuard{Driver: hd}
	g.Hold.Store(true)
	a := newAlloc(t, g, recycleConfig(true))
	old, err := a.Alloc(40*mib, s)
	require.NoError(t, err)
	require.NoError(t, a.Free(old))
	grown, err := a.Alloc(60*mib, 0)
	require.NoError(t, err)
	st := a.Stats()
	require.Zero(t, st.PagesRetired)
	require.Equal(t, int64(20), st.Unmaps, "the other stream's pages, unmapped")
	require.Equal(t, int64(1), st.Syncs, "after a wait for that stream")
	require.NoError(t, a.Free(grown))
}

// TestRetiredPagesBeforeCapture: a pool becoming active (a capture may
// follow, which forbids waits and unmaps) first unmaps the retired
// pages; the capture then makes no forbidden call.
func TestRetiredPagesBeforeCapture(t *testing.T) {
	e := newPoolEnv(t, 1<<30, recycleConfig(true))
	e.g.Hold.Store(true)
	_, fence, grown := retireScene(t, e.a)
	require.Equal(t, int64(20), e.a.Stats().PagesRetired)
	syncs := e.a.Stats().Syncs
	e.begin(pid(1), onStream(e.s))
	require.Equal(t, syncs+1, e.a.Stats().Syncs, "waited for the stream before the pool became active")
	require.Equal(t, int64(20), e.a.Stats().Unmaps)
	p := e.alloc(50*mib, e.s)
	require.NoError(t, e.a.Free(p))
	e.end(pid(1))
	require.Empty(t, e.g.Violations())
	require.NoError(t, e.a.ReleasePool(pid(1)))
	require.NoError(t, e.a.Free(grown))
	require.NoError(t, e.a.Free(fence))
}

// TestRetiredPagesFaults: an unmap of retired pages that fails leaves
// them retired (and counted as reserved) and is tried again; a growth
// whose map fails after retiring pages loses nothing. Nothing leaks.
func TestRetiredPagesFaults(t *testing.T) {
	t.Run("unmap", func(t *testing.T) {
		host, f, a := busyFaulty(t)
		old, fence, grown := retireScene(t, a)
		f.FailNth(vmmtest.OpUnmap, 1, nil)
		_, err := a.Alloc(30*mib, 0)
		require.Error(t, err, "the growth into the old addresses cannot unmap them")
		require.Equal(t, livePages(a)+20, host.Usage().Mappings, "still retired")
		// The OOM path emptied the cache; the run is still retired and the
		// next growth there unmaps it.
		again, err := a.Alloc(30*mib, 0)
		require.NoError(t, err)
		require.Equal(t, old, again)
		require.Equal(t, livePages(a), host.Usage().Mappings)
		for _, p := range []vmm.DevicePtr{again, grown, fence} {
			require.NoError(t, a.Free(p))
		}
		require.NoError(t, a.Close())
		u := host.Usage()
		require.Zero(t, u.Mappings)
		require.Zero(t, u.Handles)
	})
	t.Run("close", func(t *testing.T) {
		host, f, a := busyFaulty(t)
		retireScene(t, a)
		f.FailNth(vmmtest.OpUnmap, 1, nil)
		require.Error(t, a.Close(), "the first unmap fails")
		require.NoError(t, a.Close(), "a second Close finishes")
		u := host.Usage()
		require.Zero(t, u.Mappings)
		require.Zero(t, u.Handles)
		require.Zero(t, u.Ranges)
	})
	t.Run("map", func(t *testing.T) {
		host, f, a := busyFaulty(t)
		old, err := a.Alloc(40*mib, 0)
		require.NoError(t, err)
		fence, err := a.Alloc(2*mib, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(old))
		f.FailNth(vmmtest.OpMap, 1, nil)
		_, err = a.Alloc(60*mib, 0)
		require.Error(t, err, "the growth's map fails after the old pages were retired")
		st := a.Stats()
		require.Equal(t, int64(20), st.PagesRetired)
		require.Equal(t, st.ReservedBytes.All.Current, int64(42*mib), "the 20 pages counted once (cached), the fence")
		f.FailNth(vmmtest.OpMap, 1, vmm.ErrOutOfMemory)
		grown, err := a.Alloc(60*mib, 0)
		require.NoError(t, err, "the OOM path empties the cache and retries")
		st = a.Stats()
		require.Equal(t, st.ReservedBytes.All.Current, st.ActiveBytes.All.Current, "nothing cached or held after the retry")
		require.Equal(t, livePages(a), host.Usage().Mappings, "no old mapping left")
		require.NoError(t, a.Free(grown))
		require.NoError(t, a.Free(fence))
		require.NoError(t, a.Close())
		u := host.Usage()
		require.Zero(t, u.Mappings)
		require.Zero(t, u.Handles)
	})
}

// busyFaulty is an allocator under recycle_pages over Faulty over a
// busy stream's host driver, which the caller closes and checks.
func busyFaulty(t *testing.T) (vmm.Driver, *vmmtest.Faulty, *Allocator) {
	t.Helper()
	host := vmmtest.HostDriver(t, 1<<30)
	g := &vmmtest.CaptureGuard{Driver: host}
	g.Hold.Store(true)
	f := vmmtest.NewFaulty(g)
	a, err := New(f, 0, recycleConfig(true), nil)
	require.NoError(t, err)
	return host, f, a
}

// TestRetiredPagesConcurrent: goroutines allocating and freeing blocks of
// many sizes on one stream under recycle_pages, with the stream busy half
// the time, under -race; nothing leaks and the books balance.
func TestRetiredPagesConcurrent(t *testing.T) {
	host := vmmtest.HostDriver(t, 4<<30)
	g := &vmmtest.CaptureGuard{Driver: host}
	a, err := New(g, 0, recycleConfig(true), nil)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var live []vmm.DevicePtr
			for i := range 300 {
				g.Hold.Store(i%50 < 25)
				p, err := a.Alloc(uint64(1+(i*7+w*13)%40)*mib+uint64(i)*512, 0)
				if err != nil {
					t.Error(err)
					return
				}
				live = append(live, p)
				if len(live) > 6 {
					if err := a.Free(live[0]); err != nil {
						t.Error(err)
						return
					}
					live = live[1:]
				}
			}
			for _, p := range live {
				if err := a.Free(p); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	st := a.Stats()
	require.Positive(t, st.PagesRetired)
	require.Zero(t, st.AllocatedBytes.All.Current)
	require.NoError(t, a.EmptyCache())
	require.Zero(t, host.Usage().Mappings, "EmptyCache leaves no retired mapping")
	require.NoError(t, a.Close())
	u := host.Usage()
	require.Zero(t, u.Handles)
	require.Zero(t, u.Ranges)
}
