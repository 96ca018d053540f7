package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestCloseRetriesFailedUnmap: a Close whose unmap fails keeps what it
// could not give back and returns the error; later Closes try again,
// returning the error until they succeed, then nil.
func TestCloseRetriesFailedUnmap(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	f := vmmtest.NewFaulty(d)
	a, err := New(f, 0, matrixConfig(), nil)
	require.NoError(t, err)
	_, err = a.Alloc(50*mib, 0) // three 20 MiB pages
	require.NoError(t, err)
	f.FailNth(vmmtest.OpUnmap, 1, nil)
	f.FailNth(vmmtest.OpUnmap, 2, nil)
	require.ErrorIs(t, a.Close(), vmmtest.ErrInjected)
	u := d.Usage()
	require.Equal(t, 3, u.Mappings, "kept")
	require.Equal(t, 1, u.Ranges)
	require.ErrorIs(t, a.Close(), vmmtest.ErrInjected, "tried again, failed again")
	_, err = a.Alloc(1, 0)
	require.ErrorIs(t, err, vmm.ErrClosed)
	require.NoError(t, a.Close(), "tried again")
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
	require.NoError(t, a.Close())
}

// TestGrowthAfterFailedUndo: when Map fails and the undo's unmap fails
// too, the pages left mapped are kept in the segment's books: a later
// growth over them works (it used to fail on the overlap), and EmptyCache
// and Close give them back.
func TestGrowthAfterFailedUndo(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	f := vmmtest.NewChained(d)
	a := newAlloc(t, f, matrixConfig())
	f.FailNthThen(vmmtest.OpMap, 3, vmmtest.OpUnmap)
	_, err := a.Alloc(50*mib, 0)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.Equal(t, 2, d.Usage().Mappings, "the undo could not unmap two pages")
	require.Equal(t, int64(60*mib), a.Stats().ReservedBytes.All.Current, "two stuck pages and one cached count as reserved")
	p, err := a.Alloc(50*mib, 0)
	require.NoError(t, err, "growth over the stuck pages")
	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, d.Usage().Handles, "%v", d.Usage())

	f.FailNthThen(vmmtest.OpSetAccess, 1, vmmtest.OpUnmap)
	_, err = a.Alloc(50*mib, 0)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.NoError(t, a.EmptyCache(), "unmaps and releases the stuck pages")
	require.Zero(t, d.Usage().Mappings)
	require.Zero(t, d.Usage().Handles)
}

// TestBufferGrowFailedUndo: a Grow whose undo fails leaves Len and Cap as
// they were and keeps the stuck page, which the next Grow or Close gives
// back.
func TestBufferGrowFailedUndo(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	f := vmmtest.NewChained(d)
	b, err := NewBuffer(f, 0, 64*mib, BufferOptions{})
	require.NoError(t, err)
	require.NoError(t, b.Grow(2*mib))
	f.FailNthThen(vmmtest.OpMap, 2, vmmtest.OpUnmap)
	require.ErrorIs(t, b.Grow(4*mib), vmmtest.ErrInjected)
	require.Equal(t, uint64(2*mib), b.Len())
	require.Equal(t, uint64(2*mib), b.Cap())
	require.Equal(t, 2, d.Usage().Mappings, "one page stuck")
	require.NoError(t, b.Grow(4*mib), "over the stuck page")
	require.Equal(t, uint64(6*mib), b.Cap())

	f.FailNthThen(vmmtest.OpSetAccess, 1, vmmtest.OpUnmap)
	require.ErrorIs(t, b.Grow(4*mib), vmmtest.ErrInjected)
	f.FailNth(vmmtest.OpUnmap, 2, nil)
	require.ErrorIs(t, b.Close(), vmmtest.ErrInjected)
	require.NotZero(t, d.Usage().Handles, "kept for the next Close")
	require.NoError(t, b.Close())
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
	require.NoError(t, b.Close())
	require.ErrorIs(t, b.Grow(1), vmm.ErrClosed)
}
