package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// With whole_pages every block is whole pages of its own, so sharing it
// (PinBlock: what an importer is given) exposes nothing else; without it
// two small blocks share a page (issue 15, item 14).
func TestWholePagesShareOnlyTheBlock(t *testing.T) {
	for _, whole := range []bool{false, true} {
		cfg := ClassicConfig()
		cfg.Shareable, cfg.WholePages = true, whole
		a := newAlloc(t, vmmtest.HostDriver(t, 0), cfg)
		pin := func(size uint64) (vmm.DevicePtr, []vmm.Handle, uint64, uint64) {
			p, err := a.Alloc(size, 0)
			require.NoError(t, err)
			pn, err := a.PinBlock(p)
			require.NoError(t, err)
			require.NoError(t, pn.Unpin())
			return p, pn.Pages, pn.Offset, pn.Length
		}
		p1, pages1, off1, len1 := pin(4 << 10)
		p2, pages2, off2, _ := pin(4 << 10)
		if !whole {
			require.Equal(t, pages1, pages2, "without whole_pages two small blocks share a page")
			continue
		}
		require.NotEqual(t, pages1[0], pages2[0], "each small block has its own page")
		require.Zero(t, off1)
		require.EqualValues(t, 4<<10, len1, "the share's extent is the block")
		require.Zero(t, off2, "each block starts its page")
		p3, pages3, off3, len3 := pin(21 << 20)
		require.Len(t, pages3, 2)
		require.Zero(t, off3)
		require.EqualValues(t, 21<<20, len3)
		st := a.Stats()
		require.EqualValues(t, 8<<10+21<<20, st.RequestedBytes.All.Current, "requested bytes stay what was asked")
		require.EqualValues(t, 2*cfg.SmallPageSize+2*cfg.LargePageSize, st.AllocatedBytes.All.Current)
		for _, p := range []vmm.DevicePtr{p1, p2, p3} {
			require.NoError(t, a.Free(p))
		}
	}
}
