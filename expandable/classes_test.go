package expandable

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// classesConfig is recycleConfig(true) with Config.SizeClasses.
func classesConfig() Config {
	cfg := recycleConfig(true)
	cfg.SizeClasses = true
	cfg.OOMMaxRetries = 0
	return cfg
}

// baseOf returns the base of the segment of a that holds ptr.
func baseOf(t *testing.T, a *Allocator, ptr vmm.DevicePtr) vmm.DevicePtr {
	t.Helper()
	seg, ok := segmentOf(a, ptr)
	require.True(t, ok, "no segment holds %v", ptr)
	return seg.Base
}

// TestSizeClassesSeparateRanges: under size_classes a request under a
// page, one of [1, 2) pages, one of [2, 4) and one of [16, 32) each go to
// a range of their own on the stream, and two requests of one class share
// one; without it all four share one range and the small block sits on
// the page the next block starts in.
func TestSizeClassesSeparateRanges(t *testing.T) {
	for _, classes := range []bool{false, true} {
		cfg := recycleConfig(true)
		cfg.SizeClasses = classes
		a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
		sizes := []uint64{1 * mib, 3 * mib, 5 * mib, 40 * mib, 6 * mib}
		ps, err := alloc(a, sizes...)
		require.NoError(t, err)
		snap := a.Snapshot()
		if !classes {
			require.Len(t, snap.Segments, 1)
		} else {
			require.Len(t, snap.Segments, 4, "one range a class: <1 page, [1,2), [2,4) pages (5 and 6 MiB), [16,32)")
			seen := map[vmm.DevicePtr]bool{}
			for _, p := range ps[:4] {
				base := baseOf(t, a, p)
				require.False(t, seen[base], "two classes share the range at %v", base)
				seen[base] = true
			}
			require.Equal(t, baseOf(t, a, ps[2]), baseOf(t, a, ps[4]), "5 and 6 MiB are one class")
			for _, s := range snap.Segments {
				require.Equal(t, uint64(2*mib), s.PageSize)
			}
		}
		for _, p := range ps {
			require.NoError(t, a.Free(p))
		}
		require.NoError(t, a.Close())
	}
}

// TestSizeClassesRecycleWithoutWait: a growth of one class takes the whole
// free pages another class of its stream left, as recycling takes those
// of its own range: reserved stays at what is live, no page is created,
// and nothing waits for the stream (the pages are retired, not unmapped
// at once).
func TestSizeClassesRecycleWithoutWait(t *testing.T) {
	d := &orderDriver{Driver: vmmtest.HostDriver(t, 1<<30)}
	a := newAlloc(t, d, classesConfig())
	big, err := a.Alloc(40*mib, 0) // 20 pages: the [16, 32) class
	require.NoError(t, err)
	require.NoError(t, a.Free(big))
	before := a.Stats()
	d.log = nil
	small, err := alloc(a, 8*mib, 8*mib) // 4 pages each: the [4, 8) class
	require.NoError(t, err)
	st := a.Stats()
	require.Equal(t, int64(40*mib), st.ReservedBytes.All.Peak, "the 40 MiB class's pages moved")
	require.Equal(t, before.PagesCreated, st.PagesCreated, "no page is new")
	require.Equal(t, int64(8), st.PagesReused)
	require.NotContains(t, d.log, "sync 0", "pages of the growth's own stream need no wait")
	require.NotEqual(t, baseOf(t, a, small[0]), baseOf(t, a, big))
	for _, p := range small {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
	require.NoError(t, a.Close())
}

// TestSizeClassesPrivatePool: a private pool keeps one range a stream
// whatever the sizes (its free pages are never recycled, so ranges by
// class would strand them).
func TestSizeClassesPrivatePool(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), classesConfig())
	id := pid(1)
	require.NoError(t, a.RetainPool(id))
	var ps []vmm.DevicePtr
	for _, n := range []uint64{1 * mib, 3 * mib, 40 * mib} {
		p, err := a.AllocInPool(id, n, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	snap := a.Snapshot()
	require.Len(t, snap.Segments, 1)
	for _, p := range ps {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.ReleasePool(id))
	require.NoError(t, a.Close())
}

// TestSizeClassesConfig: the key parses, needs recycle_pages, and
// policy:classic turns it off.
func TestSizeClassesConfig(t *testing.T) {
	cfg, err := spec.ParseConfig(spec.DefaultConfig(), "size_classes:1")
	require.NoError(t, err)
	require.True(t, cfg.SizeClasses)
	_, err = spec.ParseConfig(spec.DefaultConfig(), "size_classes:1,recycle_pages:0")
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "size_classes needs recycle_pages")
	cfg, err = spec.ParseConfig(spec.DefaultConfig(), "size_classes:1,policy:classic")
	require.NoError(t, err)
	require.False(t, cfg.SizeClasses)
	_, err = spec.ParseConfig(spec.DefaultConfig(), "size_classes:maybe")
	require.Error(t, err)
	bad := recycleConfig(false)
	bad.SizeClasses = true
	_, err = New(vmmtest.HostDriver(t, 1<<30), 0, bad, nil)
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

// TestSizeClassesConcurrent allocates and frees blocks of every class from
// several goroutines on two streams at once (run it under -race): every
// block is handed out once, the classes' ranges stay consistent, and
// EmptyCache and Close leave the driver holding nothing.
func TestSizeClassesConcurrent(t *testing.T) {
	d := vmmtest.HostDriver(t, 2<<30)
	side, err := d.StreamCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.StreamDestroy(side)) }()
	before := d.Usage()
	a, err := New(d, 0, classesConfig(), nil)
	require.NoError(t, err)
	sizes := []uint64{4 << 10, 700 << 10, 2 * mib, 3 * mib, 9 * mib, 17 * mib, 33 * mib}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			s := vmm.Stream(0)
			if g%2 == 1 {
				s = side
			}
			var live []vmm.DevicePtr
			for i := range 200 {
				p, err := a.Alloc(sizes[(g+i)%len(sizes)], s)
				if err != nil {
					errs <- err
					return
				}
				live = append(live, p)
				if len(live) > 3 {
					if err := a.Free(live[0]); err != nil {
						errs <- err
						return
					}
					live = live[1:]
				}
			}
			for _, p := range live {
				if err := a.Free(p); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	require.NoError(t, errors.Join(all...))
	require.Zero(t, a.Stats().AllocatedBytes.All.Current)
	require.NoError(t, a.EmptyCache())
	require.NoError(t, a.Close())
	require.Equal(t, before, d.Usage(), "the driver holds nothing more")
}
