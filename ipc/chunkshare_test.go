//go:build linux

package ipc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// chunkedAlloc makes a shareable allocator on d with one pool of 2 MiB
// pages and chunks of up to 64 MiB.
func chunkedAlloc(t *testing.T, d vmm.Driver) *expandable.Allocator {
	t.Helper()
	cfg := expandable.ClassicConfig()
	cfg.Shareable, cfg.SmallLimit, cfg.LargePageSize, cfg.ChunkBytes = true, 0, 2<<20, 64<<20
	a, err := expandable.New(d, 0, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

// TestShareChunkedBlock: blocks of an allocator with chunks (a growth's
// inside is one allocation) are shared with their spans and read right
// through pidfd and the socket, a block starting inside another's last
// page included; a second share of the same block exports nothing new
// (the allocator keeps its exports) and a new block on new pages does.
func TestShareChunkedBlock(t *testing.T) {
	imp := backendDriver(t, "host")
	f := vmmtest.NewFaulty(backendDriver(t, "host"))
	a := chunkedAlloc(t, f)
	e := newExporter(t, ExporterOptions{})
	ctx := context.Background()
	var opts []OpenOptions
	for _, tr := range []Transport{TransportSocket, TransportPidfd} {
		if tr == TransportPidfd && ProbePidfdGetfd() != nil {
			continue
		}
		opts = append(opts, OpenOptions{Fetch: FetchOptions{Transports: []Transport{tr}}})
	}
	first, err := a.Alloc(21<<20+4096, 0) // 10 whole pages, then its own last page
	require.NoError(t, err)
	second, err := a.Alloc(9<<20, 0) // starts in first's last page
	require.NoError(t, err)
	for i, b := range []struct {
		ptr   uint64
		size  uint64
		spans []int
	}{{uint64(first), 21<<20 + 4096, []int{10, 1}}, {uint64(second), 9 << 20, []int{1, 4, 1}}} {
		seed, ptr := byte(7+i), vmm.DevicePtr(b.ptr)
		require.NoError(t, writePattern(f, ptr, b.size, seed))
		exports := f.Calls(vmmtest.OpExportFD)
		for round, o := range opts {
			s, err := e.ShareBlock(f, a, ptr)
			require.NoError(t, err)
			d := s.Descriptor()
			require.Equal(t, b.spans, d.Spans, "block %d", i)
			if round > 0 {
				require.Equal(t, exports, f.Calls(vmmtest.OpExportFD), "shared again: the kept exports serve it")
			}
			exports = f.Calls(vmmtest.OpExportFD)
			desc, err := s.MarshalBinary()
			require.NoError(t, err)
			m, err := Open(ctx, desc, imp, 0, o)
			require.NoError(t, err)
			require.EqualValues(t, b.size, m.Len())
			require.NoError(t, readPattern(imp, m.Ptr(), b.size, seed), "block %d via %v", i, m.Via())
			require.NoError(t, m.Close())
			require.NoError(t, s.Close())
		}
	}
	require.NoError(t, a.Free(second))
	require.NoError(t, a.Free(first))
}

// TestShareChunkedBlockExportFails: an export that fails part way through
// a chunked block's allocations fails the share with nothing pinned and
// no fd of it left open; the allocation exported before it keeps its
// export (the allocator's, closed when it is released), and the next
// share exports only what is missing.
func TestShareChunkedBlockExportFails(t *testing.T) {
	f := vmmtest.NewFaulty(backendDriver(t, "host"))
	a := chunkedAlloc(t, f)
	e := newExporter(t, ExporterOptions{})
	start, err := countFDs()
	require.NoError(t, err)
	ptr, err := a.Alloc(9<<20, 0) // a chunk of four pages, then a page
	require.NoError(t, err)
	before, err := countFDs()
	require.NoError(t, err)
	f.FailNth(vmmtest.OpExportFD, 2, vmmtest.ErrInjected)
	_, err = e.ShareBlock(f, a, ptr)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.Zero(t, a.Pinned(), "the failed share unpinned the block")
	after, err := countFDs()
	require.NoError(t, err)
	require.Equal(t, before+1, after, "only the first allocation's kept export stays open")
	s, err := e.ShareBlock(f, a, ptr)
	require.NoError(t, err)
	require.Equal(t, 3, f.Calls(vmmtest.OpExportFD), "the second share exported only the allocation that failed")
	require.NoError(t, s.Close())
	require.NoError(t, a.Free(ptr))
	require.Eventually(t, func() bool { return a.Pinned() == 0 }, 5*time.Second, time.Millisecond)
	require.NoError(t, a.EmptyCache())
	after, err = countFDs()
	require.NoError(t, err)
	require.Equal(t, start, after, "released allocations close their kept exports")
}
