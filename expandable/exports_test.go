package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// exportAll exports every allocation of pin through its ExportFD and closes
// the fds, checking each names the allocation's memory file.
func exportAll(t *testing.T, pin handles.Pin) {
	t.Helper()
	require.NotNil(t, pin.ExportFD, "the allocator keeps its exports")
	for i := range pin.Pages {
		raw, err := pin.ExportFD(i)
		require.NoError(t, err)
		fd, err := handles.NewFD(raw)
		require.NoError(t, err)
		require.NoError(t, fd.Close())
	}
}

// TestExportsKeptUntilRelease: sharing a block again exports nothing new;
// once its pages are released (free, EmptyCache) the kept exports are
// closed, and a new block on new pages is exported afresh. After Close no
// fd is left open.
func TestExportsKeptUntilRelease(t *testing.T) {
	f := vmmtest.NewFaulty(vmmtest.HostDriver(t, 1<<30))
	base := vmmtest.TakeBaseline()
	cfg := ClassicConfig()
	cfg.Shareable = true
	a := newAlloc(t, f, cfg)
	p, err := a.Alloc(100<<20, 0)
	require.NoError(t, err)
	pin, err := a.PinBlock(p)
	require.NoError(t, err)
	exportAll(t, pin)
	n := f.Calls(vmmtest.OpExportFD)
	require.Equal(t, len(pin.Pages), n, "one export per allocation")
	require.Equal(t, n, a.pages.keptExports())
	exportAll(t, pin)
	pin2, err := a.PinBlock(p)
	require.NoError(t, err)
	exportAll(t, pin2)
	require.Equal(t, n, f.Calls(vmmtest.OpExportFD), "shared again: no new export")
	require.NoError(t, pin.Unpin())
	require.NoError(t, pin2.Unpin())

	require.NoError(t, a.Free(p))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.pages.keptExports(), "released pages drop their exports")
	p, err = a.Alloc(100<<20, 0)
	require.NoError(t, err)
	pin, err = a.PinBlock(p)
	require.NoError(t, err)
	exportAll(t, pin)
	require.Equal(t, 2*n, f.Calls(vmmtest.OpExportFD), "new pages are exported afresh, even if the driver reused handle numbers")
	require.NoError(t, pin.Unpin())
	require.NoError(t, a.Close())
	require.Zero(t, a.pages.keptExports())
	require.Empty(t, base.Leaks(f))
}

// TestExportKeptWhenReleaseFails: a release the driver refuses keeps the
// page, and with it its export; the next EmptyCache releases both.
func TestExportKeptWhenReleaseFails(t *testing.T) {
	f := vmmtest.NewFaulty(vmmtest.HostDriver(t, 1<<30))
	base := vmmtest.TakeBaseline()
	cfg := ClassicConfig()
	cfg.Shareable = true
	a := newAlloc(t, f, cfg)
	p, err := a.Alloc(30<<20, 0)
	require.NoError(t, err)
	pin, err := a.PinBlock(p)
	require.NoError(t, err)
	exportAll(t, pin)
	require.NoError(t, pin.Unpin())
	require.NoError(t, a.Free(p))
	f.FailNth(vmmtest.OpRelease, f.Calls(vmmtest.OpRelease)+1, vmmtest.ErrInjected)
	require.ErrorIs(t, a.EmptyCache(), vmmtest.ErrInjected)
	require.Equal(t, 1, a.pages.keptExports(), "the page the driver kept keeps its export")
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.pages.keptExports())
	require.NoError(t, a.Close())
	require.Empty(t, base.Leaks(f))
}

// TestExportFailsCleanly: a failed export keeps nothing and the next
// share tries again.
func TestExportFailsCleanly(t *testing.T) {
	f := vmmtest.NewFaulty(vmmtest.HostDriver(t, 1<<30))
	cfg := ClassicConfig()
	cfg.Shareable = true
	a := newAlloc(t, f, cfg)
	p, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	pin, err := a.PinBlock(p)
	require.NoError(t, err)
	f.FailNth(vmmtest.OpExportFD, 1, vmmtest.ErrInjected)
	_, err = pin.ExportFD(0)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.Zero(t, a.pages.keptExports())
	exportAll(t, pin)
	require.Equal(t, 1, a.pages.keptExports())
	require.NoError(t, pin.Unpin())
	_, err = pin.ExportFD(0)
	require.ErrorIs(t, err, vmm.ErrInvalid, "an ended pin exports nothing: its handles may name other memory by now")
	require.NoError(t, a.Free(p))
}

// TestPinChunkedBlock: a block grown with chunks pins its allocations
// whole, with their spans, and a block that starts inside a chunk's last
// page pins that chunk from its first page (the importer maps it whole).
func TestPinChunkedBlock(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg := chunkConfig(64 * mib)
	cfg.Shareable = true
	a := newAlloc(t, d, cfg)
	const size = 21*mib + 4096 // 10 whole pages, then a page of its own
	p, err := a.Alloc(size, 0)
	require.NoError(t, err)
	pin, err := a.PinBlock(p)
	require.NoError(t, err)
	require.Equal(t, []int{10, 1}, pin.Spans)
	require.Len(t, pin.Pages, 2)
	require.Zero(t, pin.Offset)
	require.EqualValues(t, size, pin.Length)
	require.NoError(t, pin.Unpin())

	// A second block of 3 pages wholly inside: one chunk of 2 pages, and
	// it starts in the first block's last page (its own page).
	q, err := a.Alloc(5*mib, 0)
	require.NoError(t, err)
	pq, err := a.PinBlock(q)
	require.NoError(t, err)
	require.Equal(t, uint64(q-p)-10*2*mib, pq.Offset, "offset from the start of its first allocation")
	total := 0
	for _, s := range pq.Spans {
		total += s
	}
	if pq.Spans == nil {
		total = len(pq.Pages)
	}
	require.GreaterOrEqual(t, uint64(total)*2*mib, pq.Offset+pq.Length)
	require.Less(t, pq.Offset, uint64(2*mib), "the block starts in the first allocation")
	require.NoError(t, pq.Unpin())
	require.NoError(t, a.Free(q))
	require.NoError(t, a.Free(p))

	// Carve a block that starts in the chunk's middle: it pins the chunk
	// from its first page.
	big, err := a.Alloc(40*mib, 0)
	require.NoError(t, err)
	pb, err := a.PinBlock(big)
	require.NoError(t, err)
	require.NotNil(t, pb.Spans)
	require.Equal(t, len(pb.Pages), len(pb.Spans))
	require.NoError(t, pb.Unpin())
	require.NoError(t, a.Free(big))
	_, err = a.PinBlock(vmm.DevicePtr(1))
	require.Error(t, err)
}
