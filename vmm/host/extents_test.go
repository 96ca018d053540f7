//go:build linux

package host

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

func TestFreeList(t *testing.T) {
	type op struct {
		give      bool
		off, size uint64 // give: the extent; take: off is the expected offset
		fail      bool   // take: no room
	}
	for _, tc := range []struct {
		name string
		ops  []op
		want []extent
	}{
		{"take ascending", []op{{true, 0, 10, false}, {false, 0, 2, false}, {false, 2, 3, false}}, []extent{{5, 5}}},
		{"take all", []op{{true, 0, 4, false}, {false, 0, 4, false}, {false, 0, 1, true}}, nil},
		{"merge both sides", []op{{true, 0, 2, false}, {true, 4, 2, false}, {true, 2, 2, false}}, []extent{{0, 6}}},
		{"merge prev", []op{{true, 0, 2, false}, {true, 2, 2, false}}, []extent{{0, 4}}},
		{"merge next", []op{{true, 2, 2, false}, {true, 0, 2, false}}, []extent{{0, 4}}},
		{"no merge", []op{{true, 5, 1, false}, {true, 0, 1, false}, {true, 3, 1, false}}, []extent{{0, 1}, {3, 1}, {5, 1}}},
		{"first fit skips small", []op{{true, 0, 1, false}, {true, 10, 5, false}, {false, 10, 3, false}}, []extent{{0, 1}, {13, 2}}},
		{
			// After taking [0,2) the hint is 2; freeing [0,2) again, the
			// next page still goes right after the last one.
			"hint first", []op{{true, 0, 8, false}, {false, 0, 2, false}, {true, 0, 2, false}, {false, 2, 2, false}},
			[]extent{{0, 2}, {4, 4}},
		},
		{
			"hint not free, first fit", []op{{true, 0, 8, false}, {false, 0, 8, false}, {true, 0, 4, false}, {false, 0, 1, false}},
			[]extent{{1, 3}},
		},
		{"split in the middle", []op{{true, 0, 8, false}, {false, 0, 2, false}, {true, 0, 2, false}, {false, 2, 3, false}}, []extent{{0, 2}, {5, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f freeList
			for i, o := range tc.ops {
				if o.give {
					f.give(o.off, o.size)
					continue
				}
				off, ok := f.take(o.size)
				require.Equal(t, !o.fail, ok, "op %d", i)
				if ok {
					require.Equal(t, o.off, off, "op %d", i)
				}
			}
			if len(tc.want) == 0 {
				require.Empty(t, f.ext)
				return
			}
			require.Equal(t, tc.want, f.ext)
		})
	}
}

func TestFreeListPanicsOnDoubleFree(t *testing.T) {
	var f freeList
	f.give(4, 4)
	for _, e := range []extent{{4, 4}, {2, 3}, {7, 2}, {5, 1}} {
		require.Panics(t, func() { f.give(e.off, e.size) }, "%v", e)
	}
	require.Equal(t, []extent{{4, 4}}, f.ext)
	require.Equal(t, uint64(4), f.free())
}

func TestParseMemfdDevice(t *testing.T) {
	for _, tc := range []struct {
		link string
		dev  vmm.Device
		ok   bool
	}{
		{"/memfd:xseg-host-dev3 (deleted)", 3, true},
		{"/memfd:xseg-host-dev0", 0, true},
		{"/memfd:xseg-host-dev (deleted)", 0, false},
		{"/memfd:xseg-host-dev-1 (deleted)", 0, false},
		{"/memfd:xseg-host-arena-dev2 (deleted)", 0, false},
		{"/tmp/xseg-host-dev2", 0, false},
	} {
		dev, ok := parseMemfdDevice(tc.link)
		require.Equal(t, tc.ok, ok, tc.link)
		require.Equal(t, tc.dev, dev, tc.link)
	}
}

// An imported page is on the device its exporter made it on.
func TestImportKeepsTheDevice(t *testing.T) {
	d, err := Open(Options{Devices: 2})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	h, err := d.Create(1, DefaultGranularity, vmm.HandlePosixFD)
	require.NoError(t, err)
	fd, err := d.ExportFD(h)
	require.NoError(t, err)
	ih, err := d.ImportFD(fd)
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	p, err := d.books.Page(ih)
	require.NoError(t, err)
	require.Equal(t, vmm.Device(1), p.Device)
	free, _, err := d.MemInfo(1)
	require.NoError(t, err)
	require.Equal(t, d.opts.Capacity-DefaultGranularity, free, "the import takes no capacity")
	require.NoError(t, d.Release(ih))
	require.NoError(t, d.Release(h))
}
