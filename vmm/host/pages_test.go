//go:build linux

package host_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// Pages without HandlePosixFD are extents of the arena, not fds of their
// own; exportable pages do cost one fd each (which shows the count works).
func TestArenaPagesTakeNoFD(t *testing.T) {
	d := open(t, host.Options{})
	before := fdCount(t)
	var hs []vmm.Handle
	for range 1000 {
		h, err := d.Create(0, gran, vmm.HandleNone)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	require.LessOrEqual(t, fdCount(t)-before, 1, "1000 arena pages opened fds")

	mid := fdCount(t)
	for range 10 {
		h, err := d.Create(0, gran, vmm.HandlePosixFD)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	require.Equal(t, mid+10, fdCount(t), "exportable pages have a memfd each")

	for _, h := range hs {
		require.NoError(t, d.Release(h))
	}
	require.LessOrEqual(t, fdCount(t), before+1)
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
}

// Arena pages created one after another and mapped one after another merge
// into one kernel mapping; pages of their own cannot.
func TestConsecutivePagesMergeIntoOneVMA(t *testing.T) {
	for _, tc := range []struct {
		name  string
		types vmm.HandleType
		vmas  int
	}{
		{"arena", vmm.HandleNone, 1},
		{"own memfd", vmm.HandlePosixFD, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := open(t, host.Options{})
			const n = 64
			size := n * gran
			ptr, err := d.Reserve(size, 0)
			require.NoError(t, err)
			var hs []vmm.Handle
			for i := range n {
				h, err := d.Create(0, gran, tc.types)
				require.NoError(t, err)
				require.NoError(t, d.Map(ptr.Add(uint64(i)*gran), gran, h, 0))
				hs = append(hs, h)
			}
			require.NoError(t, d.SetAccess(ptr, size, vmm.ReadWrite(0)))
			require.Equal(t, tc.vmas, vmasIn(t, ptr, size))
			require.NoError(t, d.Memset(ptr, 0x5a, size))

			require.NoError(t, d.Unmap(ptr, size))
			require.Equal(t, 1, vmasIn(t, ptr, size), "unmapped range is one reservation again")
			for _, h := range hs {
				require.NoError(t, d.Release(h))
			}
			require.NoError(t, d.Unreserve(ptr, size))
			require.Zero(t, vmasIn(t, ptr, size))
		})
	}
}

// A page mapped at two addresses shows the same bytes at both.
func TestPageMappedTwiceSharesBytes(t *testing.T) {
	for _, types := range []vmm.HandleType{vmm.HandleNone, vmm.HandlePosixFD} {
		t.Run(types.String(), func(t *testing.T) {
			d := open(t, host.Options{})
			ptr, err := d.Reserve(2*gran, 0)
			require.NoError(t, err)
			h, err := d.Create(0, gran, types)
			require.NoError(t, err)
			require.NoError(t, d.Map(ptr, gran, h, 0))
			require.NoError(t, d.Map(ptr.Add(gran), gran, h, 0))
			require.NoError(t, d.SetAccess(ptr, 2*gran, vmm.ReadWrite(0)))

			want := fill(4096, 3)
			require.NoError(t, d.CopyHtoD(ptr.Add(gran-4096), want))
			got := make([]byte, len(want))
			require.NoError(t, d.CopyDtoH(got, ptr.Add(2*gran-4096)))
			require.Equal(t, want, got)

			require.ErrorIs(t, d.Release(h), vmm.ErrInUse)
			require.NoError(t, d.Unmap(ptr, 2*gran), "a run of two mappings")
			require.NoError(t, d.Release(h))
			require.NoError(t, d.Unreserve(ptr, 2*gran))
		})
	}
}

func TestCapacity(t *testing.T) {
	d := open(t, host.Options{Capacity: 4 * gran})
	var hs []vmm.Handle
	for _, types := range []vmm.HandleType{vmm.HandleNone, vmm.HandlePosixFD, vmm.HandleNone} {
		h, err := d.Create(0, gran, types)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	_, err := d.Create(0, 2*gran, vmm.HandleNone)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	_, err = d.Create(0, 2*gran, vmm.HandlePosixFD)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	p, err := d.MemAlloc(0, 100)
	require.NoError(t, err)
	free, total, err := d.MemInfo(0)
	require.NoError(t, err)
	require.Equal(t, 4*gran, total)
	require.Equal(t, gran-4096, free)
	_, err = d.Create(0, gran, vmm.HandleNone)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.NoError(t, d.MemFree(p))

	// An imported page takes no capacity of the importer.
	h, err := d.Create(0, gran, vmm.HandleNone)
	require.NoError(t, err)
	hs = append(hs, h)
	free, _, err = d.MemInfo(0)
	require.NoError(t, err)
	require.Zero(t, free)
	other := open(t, host.Options{})
	oh, err := other.Create(0, gran, vmm.HandlePosixFD)
	require.NoError(t, err)
	fd, err := other.ExportFD(oh)
	require.NoError(t, err)
	ih, err := d.ImportFD(fd)
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	require.NoError(t, d.Release(ih))
	require.NoError(t, other.Release(oh))

	for _, h := range hs {
		require.NoError(t, d.Release(h))
	}
	free, _, err = d.MemInfo(0)
	require.NoError(t, err)
	require.Equal(t, 4*gran, free)
}

// Create/release cycles do not exhaust the capacity, and a released page's
// bytes are punched out: the next page there reads zeros.
func TestReleaseGivesTheExtentBack(t *testing.T) {
	d := open(t, host.Options{Capacity: 4 * gran})
	ptr, err := d.Reserve(4*gran, 0)
	require.NoError(t, err)
	zeros := make([]byte, 4*gran)
	got := make([]byte, 4*gran)
	for range 20 {
		var hs []vmm.Handle
		for i := range 4 {
			h, err := d.Create(0, gran, vmm.HandleNone)
			require.NoError(t, err)
			require.NoError(t, d.Map(ptr.Add(uint64(i)*gran), gran, h, 0))
			hs = append(hs, h)
		}
		require.NoError(t, d.SetAccess(ptr, 4*gran, vmm.ReadWrite(0)))
		require.NoError(t, d.CopyDtoH(got, ptr))
		require.Equal(t, zeros, got, "a fresh page reads zeros")
		require.NoError(t, d.Memset(ptr, 0xff, 4*gran))
		require.NoError(t, d.Unmap(ptr, 4*gran))
		for _, h := range hs {
			require.NoError(t, d.Release(h))
		}
	}
	require.NoError(t, d.Unreserve(ptr, 4*gran))
}

// When the free capacity is fragmented in the arena, the arena grows.
func TestFragmentedArenaGrows(t *testing.T) {
	d := open(t, host.Options{Capacity: 4 * gran})
	var hs []vmm.Handle
	for range 4 {
		h, err := d.Create(0, gran, vmm.HandleNone)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	require.NoError(t, d.Release(hs[0]))
	require.NoError(t, d.Release(hs[2]))
	big, err := d.Create(0, 2*gran, vmm.HandleNone)
	require.NoError(t, err)
	ptr, _ := rwPagesOf(t, d, big, 2)
	want := fill(int(2*gran), 9)
	require.NoError(t, d.CopyHtoD(ptr, want))
	got := make([]byte, len(want))
	require.NoError(t, d.CopyDtoH(got, ptr))
	require.Equal(t, want, got)
	require.NoError(t, d.Release(hs[1]))
	require.NoError(t, d.Release(hs[3]))
}

// rwPagesOf maps page h of n granules read-write into a new reservation and
// undoes it, releasing h, when the test ends.
func rwPagesOf(t *testing.T, d *host.Driver, h vmm.Handle, n int) (vmm.DevicePtr, uint64) {
	t.Helper()
	size := uint64(n) * gran
	ptr, err := d.Reserve(size, 0)
	require.NoError(t, err)
	require.NoError(t, d.Map(ptr, size, h, 0))
	require.NoError(t, d.SetAccess(ptr, size, vmm.ReadWrite(0)))
	t.Cleanup(func() {
		require.NoError(t, d.Unmap(ptr, size))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Unreserve(ptr, size))
	})
	return ptr, size
}

func TestExportImport(t *testing.T) {
	before := fdCount(t)
	t.Run("share", func(t *testing.T) {
		d := open(t, host.Options{})
		ptr, h := rwPages(t, d, 1, vmm.HandlePosixFD)
		want := fill(int(gran), 1)
		require.NoError(t, d.CopyHtoD(ptr, want))

		fd, err := d.ExportFD(h)
		require.NoError(t, err)
		defer func() { require.NoError(t, unix.Close(fd)) }()
		other := open(t, host.Options{})
		ih, err := other.ImportFD(fd)
		require.NoError(t, err)
		iptr, _ := rwPagesOf(t, other, ih, 1)
		got := make([]byte, gran)
		require.NoError(t, other.CopyDtoH(got, iptr))
		require.Equal(t, want, got, "bytes written by the exporter")
		require.NoError(t, other.Memset(iptr.Add(17), 0xee, 1))
		b := make([]byte, 1)
		require.NoError(t, d.CopyDtoH(b, ptr.Add(17)))
		require.Equal(t, byte(0xee), b[0], "bytes written by the importer")

		// An imported page exports again.
		fd2, err := other.ExportFD(ih)
		require.NoError(t, err)
		require.NoError(t, unix.Close(fd2))
	})
	require.Equal(t, before, fdCount(t), "fds leaked")
}

func TestExportImportErrors(t *testing.T) {
	d := open(t, host.Options{})
	h, err := d.Create(0, gran, vmm.HandleNone)
	require.NoError(t, err)
	_, err = d.ExportFD(h)
	require.ErrorIs(t, err, vmm.ErrInvalid, "arena pages are not exportable")
	require.NoError(t, d.Release(h))
	_, err = d.ExportFD(h)
	require.ErrorIs(t, err, vmm.ErrInvalid, "released page")
	_, err = d.Create(0, gran, vmm.HandleFabric)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	_, err = d.ExportFabric(h)
	require.ErrorIs(t, err, vmm.ErrInvalid, "released page")
	live, err := d.Create(0, gran, vmm.HandleNone)
	require.NoError(t, err)
	_, err = d.ExportFabric(live)
	require.ErrorIs(t, err, vmm.ErrNotSupported, "a live page")
	require.NoError(t, d.Release(live))
	_, err = d.ImportFabric(vmm.FabricHandle{})
	require.ErrorIs(t, err, vmm.ErrNotSupported)

	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
	_, err = d.ImportFD(p[0])
	require.ErrorIs(t, err, vmm.ErrInvalid, "a pipe")
	require.NoError(t, unix.Close(p[0]))
	require.NoError(t, unix.Close(p[1]))
	_, err = d.ImportFD(p[0])
	require.ErrorIs(t, err, vmm.ErrInvalid, "a closed fd")

	mfd, err := unix.MemfdCreate("odd", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(mfd, int64(gran+4096)))
	_, err = d.ImportFD(mfd)
	require.ErrorIs(t, err, vmm.ErrInvalid, "size not a multiple of the granularity")
	require.NoError(t, unix.Close(mfd))
}
