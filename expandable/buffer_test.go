package expandable

import (
	"bytes"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

const mib = 1 << 20

// newBuffer makes a buffer over d that the test closes at its end.
func newBuffer(t *testing.T, d vmm.Driver, maxSize uint64, opts BufferOptions) *Buffer {
	t.Helper()
	b, err := NewBuffer(d, 0, maxSize, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

// pattern is n bytes that differ from those of another seed.
func pattern(seed byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}

func readBack(t *testing.T, d vmm.Driver, at vmm.DevicePtr, n int) []byte {
	t.Helper()
	got := make([]byte, n)
	require.NoError(t, d.CopyDtoH(got, at))
	return got
}

func TestBufferGrowKeepsAddressAndData(t *testing.T) {
	f := vmmtest.NewFaulty(vmmtest.HostDriver(t, 1<<30))
	b := newBuffer(t, f, 63*mib, BufferOptions{})
	require.Equal(t, uint64(64*mib), b.Max(), "max rounds up to whole pages")
	require.Zero(t, b.Len())
	require.Zero(t, b.Cap())
	ptr := b.Ptr()

	require.NoError(t, b.Grow(100))
	require.Equal(t, uint64(100), b.Len())
	require.Equal(t, uint64(2*mib), b.Cap())
	head := pattern(1, 100)
	require.NoError(t, f.CopyHtoD(ptr, head))

	access := f.Calls(vmmtest.OpSetAccess)
	require.NoError(t, b.Grow(5*mib))
	require.Equal(t, uint64(5*mib+100), b.Len())
	require.Equal(t, uint64(6*mib), b.Cap())
	require.Equal(t, 2, f.Calls(vmmtest.OpCreate)-1, "two new pages")
	require.Equal(t, 1, f.Calls(vmmtest.OpSetAccess)-access, "one set-access call for the run")
	require.Equal(t, ptr, b.Ptr(), "the address stays")
	require.Equal(t, head, readBack(t, f, ptr, 100), "the contents stay")

	tail := pattern(9, 4096)
	end := ptr.Add(b.Len() - 4096)
	require.NoError(t, f.CopyHtoD(end, tail))
	require.NoError(t, b.Grow(1)) // within the mapped pages: nothing mapped
	require.Equal(t, 3, f.Calls(vmmtest.OpCreate))
	require.Equal(t, tail, readBack(t, f, end, 4096))
}

func TestBufferGrowPastMax(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	b := newBuffer(t, d, 8*mib, BufferOptions{})
	require.NoError(t, b.Grow(6*mib))
	err := b.Grow(2*mib + 1)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.ErrorContains(t, err, "growing 6291456 bytes by 2097153 past its maximum of 8388608 bytes")
	require.Equal(t, uint64(6*mib), b.Len())
	require.Equal(t, uint64(6*mib), b.Cap())
	require.NoError(t, b.Grow(2*mib), "exactly up to the maximum")
	require.Equal(t, b.Max(), b.Cap())
}

// TestBufferDriverFailureChangesNothing fails each driver step of a grow
// of three pages in turn: the buffer stays as it was, every page made on
// the way is given back, and the next grow works.
func TestBufferDriverFailureChangesNothing(t *testing.T) {
	for _, c := range []struct {
		op  vmmtest.Op
		nth int
		oom bool
	}{
		{vmmtest.OpCreate, 1, true},
		{vmmtest.OpCreate, 3, true},
		{vmmtest.OpMap, 2, false},
		{vmmtest.OpSetAccess, 1, false},
	} {
		t.Run(string(c.op), func(t *testing.T) {
			d := vmmtest.HostDriver(t, 1<<30)
			f := vmmtest.NewFaulty(d)
			b := newBuffer(t, f, 64*mib, BufferOptions{})
			require.NoError(t, b.Grow(3*mib))
			data := pattern(3, 3*mib)
			require.NoError(t, f.CopyHtoD(b.Ptr(), data))
			before := d.Usage()

			f.FailNth(c.op, c.nth, nil)
			err := b.Grow(6 * mib)
			require.Error(t, err)
			require.ErrorIs(t, err, vmmtest.ErrInjected)
			if c.oom {
				require.ErrorIs(t, err, vmm.ErrOutOfMemory)
			}
			require.Equal(t, before, d.Usage(), "the pages made on the way are given back")
			require.Equal(t, uint64(3*mib), b.Len())
			require.Equal(t, uint64(4*mib), b.Cap())
			require.True(t, bytes.Equal(data, readBack(t, f, b.Ptr(), 3*mib)))

			require.NoError(t, b.Grow(6*mib))
			require.Equal(t, uint64(10*mib), b.Cap())
		})
	}
}

func TestBufferShrink(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	b := newBuffer(t, d, 64*mib, BufferOptions{})
	require.NoError(t, b.Grow(10*mib))
	data := pattern(5, 3*mib)
	require.NoError(t, d.CopyHtoD(b.Ptr(), data))

	require.NoError(t, b.Shrink(mib), "within the last page")
	require.Equal(t, uint64(9*mib), b.Len())
	require.Equal(t, uint64(10*mib), b.Cap())
	require.Equal(t, 5, d.Usage().Handles)

	require.NoError(t, b.Shrink(6*mib))
	require.Equal(t, uint64(3*mib), b.Len())
	require.Equal(t, uint64(4*mib), b.Cap())
	require.Equal(t, 2, d.Usage().Handles, "whole pages past the length are released")
	require.Equal(t, uint64(4*mib), d.Usage().MappedBytes)
	require.True(t, bytes.Equal(data, readBack(t, d, b.Ptr(), 3*mib)))

	err := b.Shrink(3*mib + 1)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Equal(t, uint64(3*mib), b.Len())

	st := b.Stats()
	require.Equal(t, int64(3*mib), st.AllocatedBytes.Large.Current)
	require.Equal(t, int64(10*mib), st.AllocatedBytes.Large.Peak)
	require.Equal(t, int64(4*mib), st.ReservedBytes.All.Current)
	require.Equal(t, int64(10*mib), st.ReservedBytes.All.Peak)
	require.Equal(t, int64(5), st.Maps)
	require.Equal(t, int64(3), st.Unmaps)
	require.Equal(t, int64(1), st.SetAccessCalls)
	require.Equal(t, int64(1), st.Allocations.All.Current)

	require.NoError(t, b.Shrink(3*mib))
	require.Zero(t, b.Cap())
	require.Zero(t, b.Stats().Allocations.All.Current)
	require.Zero(t, b.Stats().ReservedBytes.All.Current)
	require.NoError(t, b.Grow(mib), "grows again after shrinking to nothing")
	require.Equal(t, uint64(2*mib), b.Cap())
	require.Equal(t, int64(1), b.Stats().Segments.All.Current)
}

func TestBufferShrinkUnmapFailure(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	f := vmmtest.NewFaulty(d)
	b := newBuffer(t, f, 64*mib, BufferOptions{})
	require.NoError(t, b.Grow(8*mib))
	f.FailNth(vmmtest.OpUnmap, 2, nil)
	err := b.Shrink(8 * mib)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.ErrorContains(t, err, "3 pages stay mapped")
	require.Zero(t, b.Len(), "the length asked for")
	require.Equal(t, uint64(6*mib), b.Cap(), "three pages stay mapped")
	require.Equal(t, 3, d.Usage().Handles)
	require.NoError(t, b.Shrink(0), "tries again")
	require.Zero(t, b.Cap())
	require.Zero(t, d.Usage().Handles)
}

func TestBufferClose(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	b, err := NewBuffer(d, 0, 64*mib, BufferOptions{})
	require.NoError(t, err)
	require.NoError(t, b.Grow(5*mib))
	require.NoError(t, b.Close())
	require.True(t, d.Usage().Zero(), "everything given back: %v", d.Usage())
	require.NoError(t, b.Close(), "idempotent")
	require.ErrorIs(t, b.Grow(1), vmm.ErrClosed)
	require.ErrorIs(t, b.Shrink(0), vmm.ErrClosed)
	_, err = b.PinBlock(b.Ptr())
	require.ErrorIs(t, err, vmm.ErrClosed)
}

func TestNewBufferBadInput(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	_, err := NewBuffer(d, 0, 0, BufferOptions{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = NewBuffer(d, 0, 64*mib, BufferOptions{PageSize: 3 * mib})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = NewBuffer(d, 7, 64*mib, BufferOptions{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	f := vmmtest.NewFaulty(d)
	f.FailNth(vmmtest.OpReserve, 1, nil)
	_, err = NewBuffer(f, 0, 64*mib, BufferOptions{})
	require.ErrorIs(t, err, vmmtest.ErrInjected)

	b := newBuffer(t, d, 64*mib, BufferOptions{PageSize: 4 * mib})
	require.NoError(t, b.Grow(1))
	require.Equal(t, uint64(4*mib), b.Cap())
}

// TestNewBufferMaxOverflow: a maximum that rounds up past 2^64-1 to whole
// pages (math.MaxUint64 for "no limit", or a huge page size) wrapped to a
// reservation of 0 bytes, which the driver was asked for and refused with
// "reserving 0 bytes". NewBuffer refuses it itself, naming the maximum.
func TestNewBufferMaxOverflow(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	f := vmmtest.NewFaulty(d)
	for _, c := range []struct{ max, page uint64 }{
		{math.MaxUint64, 0},
		{math.MaxUint64 - 2*mib + 2, 0},
		{1<<63 + 1, 1 << 63},
	} {
		_, err := NewBuffer(f, 0, c.max, BufferOptions{PageSize: c.page})
		require.ErrorIs(t, err, vmm.ErrInvalid, c.max)
		require.ErrorContains(t, err, fmt.Sprintf("maximum size %d", c.max))
		require.NotContains(t, err.Error(), "reserving 0 bytes")
	}
	require.Zero(t, f.Calls(vmmtest.OpReserve), "nothing asked of the driver")
	require.True(t, d.Usage().Zero())
}

// TestBufferPinShare maps the pages PinBlock lists a second time, through
// exported fds, as another process would, and sees the buffer's contents;
// while pinned, the pages cannot be shrunk away.
func TestBufferPinShare(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	b := newBuffer(t, d, 64*mib, BufferOptions{Shareable: true})
	_, err := b.PinBlock(b.Ptr())
	require.ErrorIs(t, err, vmm.ErrInvalid, "empty")
	require.NoError(t, b.Grow(3*mib))
	data := pattern(11, 3*mib)
	require.NoError(t, d.CopyHtoD(b.Ptr(), data))
	_, err = b.PinBlock(b.Ptr() + 4096)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	pin, err := b.PinBlock(b.Ptr())
	require.NoError(t, err)
	require.Len(t, pin.Pages, 2)
	require.Equal(t, uint64(3*mib), pin.Length)
	require.Equal(t, uint64(2*mib), pin.PageSize)
	require.Zero(t, pin.Offset)

	view, err := d.Reserve(4*mib, 0)
	require.NoError(t, err)
	var imported []vmm.Handle
	for i, h := range pin.Pages {
		fd, err := d.ExportFD(h)
		require.NoError(t, err)
		ih, err := d.ImportFD(fd)
		require.NoError(t, closeFD(fd))
		require.NoError(t, err)
		imported = append(imported, ih)
		require.NoError(t, d.Map(view.Add(uint64(i)*2*mib), 2*mib, ih, 0))
	}
	require.NoError(t, d.SetAccess(view, 4*mib, vmm.ReadWrite(0)))
	require.True(t, bytes.Equal(data, readBack(t, d, view, 3*mib)))

	require.NoError(t, b.Grow(4*mib))
	require.NoError(t, b.Shrink(4*mib), "pages past the pin go")
	require.ErrorIs(t, b.Shrink(2*mib), vmm.ErrInUse, "a pinned page stays")
	require.Equal(t, uint64(3*mib), b.Len())
	require.NoError(t, pin.Unpin())
	require.NoError(t, pin.Unpin(), "only the first unpin counts")
	require.NoError(t, b.Shrink(2*mib))

	require.NoError(t, d.Unmap(view, 4*mib))
	for _, h := range imported {
		require.NoError(t, d.Release(h))
	}
	require.NoError(t, d.Unreserve(view, 4*mib))

	plain := newBuffer(t, d, 8*mib, BufferOptions{})
	require.NoError(t, plain.Grow(1))
	_, err = plain.PinBlock(plain.Ptr())
	require.ErrorIs(t, err, vmm.ErrNotSupported)
}

func TestBufferConcurrentGrow(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	b := newBuffer(t, d, 256*mib, BufferOptions{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				require.NoError(t, b.Grow(mib+512))
				_ = b.Len()
				_ = b.Cap()
			}
		})
	}
	wg.Wait()
	require.Equal(t, uint64(80*(mib+512)), b.Len())
	require.Equal(t, roundUp(80*(mib+512), 2*mib), b.Cap())
	require.NoError(t, b.Shrink(b.Len()))
	require.Zero(t, d.Usage().Handles)
}
