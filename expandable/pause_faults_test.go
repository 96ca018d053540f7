package expandable

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// Faults injected into every driver call of Pause and of Resume, alone and
// followed by the failure of the Unmap or Release that undoes them. After
// each, the tag is wholly live with its bytes or wholly paused with its
// backup, never in between; a retry without faults works; Close gives
// everything back.

// faultCase is one fault: the n-th call of op fails (with err, nil for
// Faulty's default), then, if set, the next call of then.
type faultCase struct {
	op   vmmtest.Op
	n    int
	then vmmtest.Op
	err  error
}

func (c faultCase) String() string {
	s := fmt.Sprintf("%s#%d", c.op, c.n)
	if c.then != "" {
		s += "+" + string(c.then)
	}
	if c.err != nil {
		s += fmt.Sprintf("(%v)", c.err)
	}
	return s
}

func (c faultCase) arm(f *vmmtest.Faulty) {
	if c.then != "" {
		f.FailNthThen(c.op, c.n, c.then)
		return
	}
	f.FailNth(c.op, c.n, c.err)
}

// faultConfig has 2 MiB large pages: faultSizes take one small page and
// a run of two large ones, in little memory to write and check.
func faultConfig() Config {
	cfg := matrixConfig()
	cfg.LargePageSize = 2 * mib
	return cfg
}

var faultSizes = []uint64{4 << 10, 100 << 10, 3 * mib / 2, 5 * mib / 2}

// faultEnv is a pauseEnv on its own host driver, with tagged blocks and a
// block of the shared pools, all written.
type faultEnv struct {
	*pauseEnv
	bs    []block
	other block
}

func newFaultEnv(t *testing.T) (*faultEnv, func()) {
	t.Helper()
	hd, err := hostOpen(0)
	require.NoError(t, err)
	base := vmmtest.TakeBaseline()
	e := &faultEnv{pauseEnv: newPauseEnv(t, hd, faultConfig())}
	e.bs = e.allocTagged(faultSizes...)
	p, err := e.a.Alloc(1*mib, 0)
	require.NoError(t, err)
	e.other = block{ptr: p, size: 1 * mib, seed: 42}
	require.NoError(t, hd.CopyHtoD(p, tagBytes(e.other.size, e.other.seed)))
	return e, func() {
		t.Helper()
		require.NoError(t, e.a.Close())
		require.Empty(t, base.Leaks(hd))
		require.NoError(t, hd.Close())
	}
}

// cases lists every fault of ops over the calls a dry run of act made, alone
// and followed by a failed undo.
func faultCases(t *testing.T, ops []vmmtest.Op, setup func(*faultEnv), act func(*faultEnv) error) []faultCase {
	t.Helper()
	e, done := newFaultEnv(t)
	setup(e)
	e.f.Reset()
	require.NoError(t, act(e))
	var cases []faultCase
	for _, op := range ops {
		n := e.f.Calls(op)
		require.NotZero(t, n, "the path calls %s", op)
		for i := 1; i <= n; i++ {
			for _, then := range []vmmtest.Op{"", vmmtest.OpUnmap, vmmtest.OpRelease} {
				cases = append(cases, faultCase{op: op, n: i, then: then})
			}
		}
	}
	done()
	return cases
}

// requirePaused checks that the tag is wholly paused: flagged so, nothing
// of it mapped once EmptyCache has unmapped what a failed undo left stuck,
// allocations in it refused.
func (e *faultEnv) requirePaused(t *testing.T, c faultCase, mappings int) {
	t.Helper()
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.True(t, ts.Paused, "%v", c)
	require.Zero(t, ts.ReservedBytes, "%v", c)
	e.reservedIsHeld()
	_, err = e.a.AllocInPool(e.id, 4096, 0)
	require.ErrorIs(t, err, ErrPausedForTest, "%v", c)
	require.NoError(t, e.a.EmptyCache(), "%v", c)
	require.Equal(t, mappings, e.host.Usage().Mappings, "%v: only the shared block is mapped", c)
	for _, b := range e.bs {
		_, err := e.host.GetAccess(b.ptr, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid, "%v: %v is not mapped", c, b.ptr)
	}
}

// requireLive checks that the tag is wholly live with its bytes.
func (e *faultEnv) requireLive(t *testing.T, c faultCase, usage vmm.Usage) {
	t.Helper()
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.False(t, ts.Paused, "%v", c)
	require.NoError(t, e.intact(e.bs), "%v", c)
	require.Equal(t, usage, e.host.Usage(), "%v: the tag's pages, as before", c)
	e.reservedIsHeld()
}

func TestPauseFaults(t *testing.T) {
	ops := []vmmtest.Op{vmmtest.OpDeviceSynchronize, vmmtest.OpCopyDtoH, vmmtest.OpUnmap, vmmtest.OpRelease}
	pause := func(e *faultEnv) error { return e.a.Pause(true, tagName) }
	cases := faultCases(t, ops, func(*faultEnv) {}, pause)
	live, paused := 0, 0
	for _, c := range cases {
		e, done := newFaultEnv(t)
		usage := e.host.Usage()
		c.arm(e.f)
		err := pause(e)
		e.f.Reset()
		require.Error(t, err, "%v", c)
		ts, serr := e.a.TagStats(tagName)
		require.NoError(t, serr)
		if ts.Paused {
			paused++
			e.requirePaused(t, c, 1)
		} else {
			live++
			e.requireLive(t, c, usage)
			require.NoError(t, pause(e), "%v: pausing again", c)
		}
		require.NoError(t, e.a.Resume(), "%v", c)
		e.requireLive(t, c, usage)
		require.NoError(t, e.intact([]block{e.other}), "%v", c)
		done()
	}
	require.NotZero(t, live, "some faults leave the tag live")
	require.NotZero(t, paused, "some leave it paused")
}

// TestPauseFreePagesFaults: a tag with whole free pages gives them back
// at Pause before it unmaps the rest; a fault in any Unmap or Release of
// that (and in the undo after it) leaves the tag wholly live with its
// bytes or wholly paused, ReservedBytes equal to the driver's pages, and
// a Resume without faults brings back the live blocks (not the free
// pages); Close leaves no leak (done).
func TestPauseFreePagesFaults(t *testing.T) {
	ops := []vmmtest.Op{vmmtest.OpUnmap, vmmtest.OpRelease}
	setup := func(e *faultEnv) {
		p, err := e.a.AllocInPool(e.id, 6*mib, 0)
		require.NoError(t, err)
		require.NoError(t, e.a.Free(p))
	}
	pause := func(e *faultEnv) error { return e.a.Pause(true, tagName) }
	cases := faultCases(t, ops, setup, pause)
	for _, c := range cases {
		e, done := newFaultEnv(t)
		ts, err := e.a.TagStats(tagName)
		require.NoError(t, err)
		live := ts.ReservedBytes // the pages of the live blocks
		setup(e)
		c.arm(e.f)
		err = pause(e)
		e.f.Reset()
		require.Error(t, err, "%v", c)
		ts, serr := e.a.TagStats(tagName)
		require.NoError(t, serr)
		if ts.Paused {
			e.requirePaused(t, c, 1)
		} else {
			require.NoError(t, e.intact(e.bs), "%v", c)
			e.reservedIsHeld()
			require.NoError(t, pause(e), "%v: pausing again", c)
		}
		require.NoError(t, e.a.Resume(), "%v", c)
		require.NoError(t, e.intact(e.bs), "%v", c)
		require.NoError(t, e.intact([]block{e.other}), "%v", c)
		e.reservedIsHeld()
		// A fault may have kept the free pages (mapped again by Resume): a
		// pause without faults gives them back.
		require.NoError(t, pause(e), "%v", c)
		require.NoError(t, e.a.Resume(), "%v", c)
		ts, serr = e.a.TagStats(tagName)
		require.NoError(t, serr)
		require.Equal(t, live, ts.ReservedBytes, "%v: the tag holds its live blocks' pages only", c)
		require.NoError(t, e.intact(e.bs), "%v", c)
		done()
	}
}

func TestResumeFaults(t *testing.T) {
	ops := []vmmtest.Op{vmmtest.OpCreate, vmmtest.OpMap, vmmtest.OpSetAccess, vmmtest.OpCopyHtoD}
	setup := func(e *faultEnv) {
		require.NoError(t, e.a.Pause(true))
		require.NoError(t, e.a.EmptyCache())
	}
	resume := func(e *faultEnv) error { return e.a.Resume(tagName) }
	cases := faultCases(t, ops, setup, resume)
	// Create fails with vmm.ErrOutOfMemory by default, which Resume meets
	// by emptying the cache and trying again: fail it otherwise too.
	for i := 1; i <= 3; i++ {
		cases = append(cases, faultCase{op: vmmtest.OpCreate, n: i, err: vmmtest.ErrInjected})
	}
	failed := 0
	for _, c := range cases {
		e, done := newFaultEnv(t)
		usage := e.host.Usage()
		setup(e)
		c.arm(e.f)
		err := resume(e)
		e.f.Reset()
		if ts, serr := e.a.TagStats(tagName); serr == nil && ts.Paused {
			failed++
			require.Error(t, err, "%v", c)
			e.requirePaused(t, c, 1)
			require.NoError(t, resume(e), "%v: resuming again", c)
		} else {
			require.NoError(t, err, "%v: a resumed tag reports no error", c)
			require.True(t, c.op == vmmtest.OpCreate && c.err == nil, "%v: only an out-of-memory Create is retried", c)
		}
		e.requireLive(t, c, usage)
		done()
	}
	require.Greater(t, failed, len(cases)/2, "most faults fail the resume")
}

// TestPauseFaultMatrix runs pause and resume through the generic fault
// matrix: every Reserve, Create, Map, Unmap, SetAccess, Release...
// failed in turn, then the allocator still pauses and resumes with its
// bytes, and Close gives everything back.
func TestPauseFaultMatrix(t *testing.T) {
	scenario := vmmtest.Scenario{Name: "pause-resume", Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
		a, err := New(d, 0, faultConfig(), nil)
		if err != nil {
			return vmmtest.Subject{}, err
		}
		id, err := a.Tag(tagName)
		if err != nil {
			return vmmtest.Subject{}, errors.Join(err, a.Close())
		}
		var bs []vmm.DevicePtr
		for _, size := range faultSizes {
			p, err := a.AllocInPool(id, size, 0)
			if err == nil {
				err = d.CopyHtoD(p, tagBytes(size, size))
			}
			if err != nil {
				return vmmtest.Subject{}, errors.Join(err, a.Close())
			}
			bs = append(bs, p)
		}
		act := func() error { return errors.Join(a.Pause(true), a.Resume()) }
		return vmmtest.Subject{
			Act: act,
			Again: func() error {
				if err := errors.Join(a.Resume(), act()); err != nil {
					return err
				}
				for i, p := range bs {
					got := make([]byte, faultSizes[i])
					if err := d.CopyDtoH(got, p); err != nil {
						return err
					}
					if string(got) != string(tagBytes(faultSizes[i], faultSizes[i])) {
						return fmt.Errorf("block %v lost its bytes", p)
					}
				}
				return nil
			},
			Close: a.Close,
		}, nil
	}}
	n := vmmtest.RunMatrix(t, func() (vmm.Driver, error) { return hostOpen(0) }, []vmmtest.Scenario{scenario})
	require.NotZero(t, n)
}
