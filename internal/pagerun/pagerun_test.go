package pagerun

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

const ps = host.DefaultGranularity

// runEnv is a run of three pages over a host driver behind a Chained
// fault injector, with a Source that creates pages and records what
// MapFrom gives back.
type runEnv struct {
	d     *vmmtest.Chained
	ptr   vmm.DevicePtr
	run   []vmm.Handle
	made  []vmm.Handle // every page Take created, in order
	given []vmm.Handle // every page handed to Give, in order
	// mapsAtTake is the number of Map calls seen at each Take.
	mapsAtTake []int
}

func newRunEnv(t *testing.T) *runEnv {
	t.Helper()
	h := vmmtest.HostDriver(t, 0)
	e := &runEnv{d: vmmtest.NewChained(h), run: make([]vmm.Handle, 3), made: []vmm.Handle{}, given: []vmm.Handle{}}
	var err error
	e.ptr, err = h.Reserve(3*ps, 0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Unreserve(e.ptr, 3*ps)) })
	return e
}

func (e *runEnv) source() Source {
	return Source{
		Take: func(int) (vmm.Handle, error) {
			e.mapsAtTake = append(e.mapsAtTake, e.d.Calls(vmmtest.OpMap))
			h, err := e.d.Create(0, ps, 0)
			if err == nil {
				e.made = append(e.made, h)
			}
			return h, err
		},
		Give: func(hs []vmm.Handle) error {
			for i, h := range hs {
				e.given = append(e.given, h)
				if err := e.d.Unwrap().Release(h); err != nil {
					return err
				}
				hs[i] = 0
			}
			return nil
		},
	}
}

func (e *runEnv) mapFrom() (int, error) {
	return MapFrom(e.d, e.ptr, ps, e.run, vmm.ReadWrite(0), e.source())
}

// mapped is the number of mappings the driver holds.
func (e *runEnv) mapped() int { return e.d.Unwrap().(*host.Driver).Usage().Mappings }

// release unmaps the first n pages of the run and releases every page of
// it that Give did not take back.
func (e *runEnv) release(t *testing.T, n int) {
	t.Helper()
	require.NoError(t, Unmap(e.d.Unwrap(), e.ptr, ps, n))
	for _, h := range e.run {
		if h != 0 {
			require.NoError(t, e.d.Unwrap().Release(h))
		}
	}
}

func TestMapFromTakesEveryPageBeforeMapping(t *testing.T) {
	e := newRunEnv(t)
	left, err := e.mapFrom()
	require.NoError(t, err)
	require.Equal(t, 3, left)
	require.Equal(t, []int{0, 0, 0}, e.mapsAtTake, "no page mapped before the last is taken")
	require.Equal(t, e.made, e.run, "the run holds the pages taken, in order")
	require.Empty(t, e.given)
	require.Equal(t, 3, e.d.Calls(vmmtest.OpMap))
	require.Equal(t, 1, e.d.Calls(vmmtest.OpSetAccess), "one SetAccess for the run")
	for i := range 3 {
		a, err := e.d.GetAccess(e.ptr.Add(uint64(i)*ps), 0)
		require.NoError(t, err)
		require.Equal(t, vmm.AccessReadWrite, a)
	}
	e.release(t, 3)
}

func TestMapFromTakeFails(t *testing.T) {
	e := newRunEnv(t)
	e.d.FailNth(vmmtest.OpCreate, 3, nil)
	left, err := e.mapFrom()
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.Zero(t, left)
	require.Len(t, e.made, 2)
	require.Equal(t, e.made, e.given, "the pages taken go back")
	require.Zero(t, e.d.Calls(vmmtest.OpMap), "nothing is mapped")
	require.Equal(t, []vmm.Handle{0, 0, 0}, e.run)
}

func TestMapFromUnwinds(t *testing.T) {
	for _, c := range []struct {
		name     string
		fail     vmmtest.Op
		n        int
		then     vmmtest.Op // fails the undo too
		wantLeft int
	}{
		{name: "map 1", fail: vmmtest.OpMap, n: 1},
		{name: "map 3", fail: vmmtest.OpMap, n: 3},
		{name: "access", fail: vmmtest.OpSetAccess, n: 1},
		{name: "map 3, undo", fail: vmmtest.OpMap, n: 3, then: vmmtest.OpUnmap, wantLeft: 2},
		{name: "access, undo", fail: vmmtest.OpSetAccess, n: 1, then: vmmtest.OpUnmap, wantLeft: 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newRunEnv(t)
			if c.then != "" {
				e.d.FailNthThen(c.fail, c.n, c.then)
			} else {
				e.d.FailNth(c.fail, c.n, nil)
			}
			left, err := e.mapFrom()
			require.ErrorIs(t, err, vmmtest.ErrInjected)
			require.Equal(t, c.wantLeft, left)
			require.Equal(t, c.wantLeft, e.mapped(), "the pages left mapped are those it says")
			require.Equal(t, e.made[c.wantLeft:], e.given, "the pages not left mapped go back")
			require.Equal(t, e.made[:c.wantLeft], e.run[:c.wantLeft], "the caller keeps the mapped ones")
			if c.then != "" {
				require.ErrorContains(t, err, "pages stay mapped")
			}
			require.True(t, slices.Equal(e.run[c.wantLeft:], make([]vmm.Handle, 3-c.wantLeft)), "Give cleared its pages")
			e.release(t, c.wantLeft)
		})
	}
}

// mapLog records the Map and Unmap calls that reach the driver.
type mapLog struct {
	vmm.Driver
	maps, unmaps [][2]uint64 // offset from base, size
	base         vmm.DevicePtr
}

func (l *mapLog) Map(ptr vmm.DevicePtr, size uint64, h vmm.Handle, off uint64) error {
	err := l.Driver.Map(ptr, size, h, off)
	if err == nil {
		l.maps = append(l.maps, [2]uint64{uint64(ptr - l.base), size})
	}
	return err
}

func (l *mapLog) Unmap(ptr vmm.DevicePtr, size uint64) error {
	err := l.Driver.Unmap(ptr, size)
	if err == nil {
		l.unmaps = append(l.unmaps, [2]uint64{uint64(ptr - l.base), size})
	}
	return err
}

// TestMapSpans maps allocations of 3, 1 and 2 pages: each whole, with one
// Map at the end of the one before, one SetAccess for all six pages; a
// failed map or access unmaps exactly what was mapped (or, if the undo
// fails too, says how many allocations stay mapped, and UnmapSpans with
// the same spans unmaps them).
func TestMapSpans(t *testing.T) {
	spans := []int{3, 1, 2}
	for _, c := range []struct {
		name     string
		fail     vmmtest.Op
		n        int
		then     vmmtest.Op
		wantLeft int
		undone   uint64 // bytes the undo unmapped
	}{
		{name: "ok", wantLeft: 3},
		{name: "map 2", fail: vmmtest.OpMap, n: 2, undone: 3 * ps},
		{name: "map 3", fail: vmmtest.OpMap, n: 3, undone: 4 * ps},
		{name: "access", fail: vmmtest.OpSetAccess, n: 1, undone: 6 * ps},
		{name: "map 3, undo", fail: vmmtest.OpMap, n: 3, then: vmmtest.OpUnmap, wantLeft: 2},
		{name: "access, undo", fail: vmmtest.OpSetAccess, n: 1, then: vmmtest.OpUnmap, wantLeft: 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := vmmtest.HostDriver(t, 0)
			base, err := h.Reserve(6*ps, 0)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, h.Unreserve(base, 6*ps)) })
			log := &mapLog{Driver: h, base: base}
			d := vmmtest.NewChained(log)
			switch {
			case c.then != "":
				d.FailNthThen(c.fail, c.n, c.then)
			case c.fail != "":
				d.FailNth(c.fail, c.n, nil)
			}
			run := make([]vmm.Handle, 3)
			made, given := []vmm.Handle{}, []vmm.Handle{}
			left, err := MapSpans(d, base, ps, spans, run, vmm.ReadWrite(0), Source{
				Take: func(i int) (vmm.Handle, error) {
					hd, err := h.Create(0, uint64(spans[i])*ps, 0)
					made = append(made, hd)
					return hd, err
				},
				Give: func(hs []vmm.Handle) error {
					for i, hd := range hs {
						given = append(given, hd)
						require.NoError(t, h.Release(hd))
						hs[i] = 0
					}
					return nil
				},
			})
			require.Equal(t, c.wantLeft, left)
			require.Equal(t, c.wantLeft, h.Usage().Mappings)
			require.Equal(t, made[c.wantLeft:], given)
			if c.fail == "" {
				require.NoError(t, err)
				require.Equal(t, [][2]uint64{{0, 3 * ps}, {3 * ps, ps}, {4 * ps, 2 * ps}}, log.maps, "each allocation whole, after the one before")
				require.Equal(t, 1, d.Calls(vmmtest.OpSetAccess))
				for i := range 6 {
					a, err := h.GetAccess(base.Add(uint64(i)*ps), 0)
					require.NoError(t, err)
					require.Equal(t, vmm.AccessReadWrite, a, "page %d", i)
				}
			} else {
				require.ErrorIs(t, err, vmmtest.ErrInjected)
				require.ErrorContains(t, err, "allocation")
				if c.then == "" {
					require.Equal(t, [][2]uint64{{0, c.undone}}, log.unmaps, "one Unmap of what was mapped")
				}
			}
			log.unmaps = nil
			require.NoError(t, UnmapSpans(h, base, ps, spans, left))
			require.Zero(t, h.Usage().Mappings)
			for _, hd := range run[:left] {
				require.NoError(t, h.Release(hd))
			}
		})
	}
	require.Equal(t, 6*ps, runBytes(ps, spans, 3))
	require.Equal(t, 4*ps, runBytes(ps, spans, 2))
	require.Equal(t, 2*ps, runBytes(ps, nil, 2))
}
