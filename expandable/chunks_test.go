package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// chunkConfig: one pool of 2 MiB pages, growths made of chunks of up to
// chunk bytes (0: one physical allocation a page).
func chunkConfig(chunk uint64) Config {
	cfg := ClassicConfig()
	cfg.SmallLimit = 0
	cfg.LargePageSize = 2 * mib
	cfg.ChunkBytes = chunk
	cfg.OOMMaxRetries = 0
	return cfg
}

// chunksRecycleConfig: recycle_pages with chunks of up to 16 MiB.
func chunksRecycleConfig() Config {
	cfg := recycleConfig(true)
	cfg.ChunkBytes = 16 * mib
	return cfg
}

// TestChunksFewCreates: a 200 MiB growth makes ceil(100 pages / 32) = 4
// physical allocations (three chunks of 64 MiB and one of 8) with one Map
// each and one SetAccess, where one a page makes 100; freed and emptied,
// it all goes back to the driver.
func TestChunksFewCreates(t *testing.T) {
	for _, tc := range []struct {
		chunk         uint64
		creates, maps int64
	}{{0, 100, 100}, {64 * mib, 4, 4}, {200 * mib, 1, 1}, {256 * mib, 1, 1}} {
		d := vmmtest.HostDriver(t, 1<<30)
		a := newAlloc(t, d, chunkConfig(tc.chunk))
		p, err := a.Alloc(200*mib, 0)
		require.NoError(t, err)
		st := a.Stats()
		require.Equal(t, tc.creates, st.PagesCreated, "chunk %d", tc.chunk)
		require.Equal(t, tc.maps, st.Maps)
		require.Equal(t, int64(1), st.SetAccessCalls)
		require.Equal(t, int(tc.creates), d.Usage().Handles)
		require.Equal(t, int(tc.maps), d.Usage().Mappings)
		require.Equal(t, int64(200*mib), st.ReservedBytes.All.Current)
		require.NoError(t, a.Free(p))
		require.NoError(t, a.EmptyCache())
		st = a.Stats()
		require.Zero(t, st.ReservedBytes.All.Current)
		require.Equal(t, tc.maps, st.Unmaps, "one Unmap a chunk")
		require.Zero(t, st.PagesReused)
		u := d.Usage()
		require.Zero(t, u.Handles, "chunks are released, not cached")
		require.Zero(t, u.Mappings)
		require.Zero(t, u.HandleBytes)
	}
}

// TestChunkSplitOnCarve: a wholly free chunk goes under the release
// threshold; a block carved from a free chunk that would end inside it
// splits it (the chunk is unmapped whole, after a sync, and the block
// grows into the hole with pages: the memory was held before, so it is
// within the chunk mark), so that no chunk is shared
// by a live block and free memory: freeing one of two blocks gives its
// memory back.
func TestChunkSplitOnCarve(t *testing.T) {
	cfg := chunkConfig(64 * mib)
	cfg.ReleaseThreshold = 2 * mib
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, cfg)
	whole, err := a.Alloc(64*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(whole)) // over the threshold, but one chunk that is whole free: unmapped
	require.Zero(t, a.Stats().ReservedBytes.All.Current, "a wholly free chunk goes under the threshold")

	cfg.ReleaseThreshold = 0
	a2 := newAlloc(t, d, cfg)
	whole, err = a2.Alloc(64*mib, 0)
	require.NoError(t, err)
	require.NoError(t, d.CopyHtoD(whole, make([]byte, 64*mib)))
	require.NoError(t, a2.Free(whole)) // one free mapped chunk
	syncs := a2.Stats().Syncs
	x, err := a2.Alloc(30*mib, 0)
	require.NoError(t, err)
	require.Equal(t, whole, x, "x takes the freed chunk's place")
	st := a2.Stats()
	require.Equal(t, int64(1), st.Unmaps, "the chunk x would end inside, unmapped whole")
	require.Equal(t, syncs+1, st.Syncs, "after waiting for its stream")
	require.Equal(t, int64(1+15), st.PagesCreated, "x gets pages: it stays within the 64 MiB the allocator held")
	require.Equal(t, int64(30*mib), st.ReservedBytes.All.Current, "the rest of the chunk went back")
	y, err := a2.Alloc(30*mib, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1+15+15), a2.Stats().PagesCreated, "y too: 60 MiB is still within the mark")
	require.Equal(t, 30, d.Usage().Mappings)
	require.NoError(t, a2.Free(x))
	require.NoError(t, a2.EmptyCache())
	st = a2.Stats()
	require.Equal(t, int64(30*mib), st.ReservedBytes.All.Current, "x's pages go; y's stay")
	require.Equal(t, 15, d.Usage().Mappings)
	require.NoError(t, d.CopyHtoD(y, make([]byte, 30*mib)), "y is still mapped")
	// Emptied, the allocator holds 30 MiB: a growth past that claims memory
	// anew and gets a chunk again.
	z, err := a2.Alloc(40*mib, 0)
	require.NoError(t, err)
	require.Equal(t, int64(1+15+15+1), a2.Stats().PagesCreated, "z: one chunk past the mark")
	require.Equal(t, 16, d.Usage().Mappings)
	require.NoError(t, a2.Free(z))
	require.NoError(t, a2.Free(y))
	require.NoError(t, a2.EmptyCache())
	require.Zero(t, a2.Stats().ReservedBytes.All.Current)
	require.Zero(t, d.Usage().Mappings)
	require.Zero(t, d.Usage().Handles)
}

// TestChunksOnlyAtTheFrontier: a growth into a hole inside the segment
// (opened by unmapping free pages) gets pages of its own, not a chunk;
// one past everything mapped gets a chunk.
func TestChunksOnlyAtTheFrontier(t *testing.T) {
	cfg := chunkConfig(64 * mib)
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, cfg)
	first, err := a.Alloc(20*mib, 0)
	require.NoError(t, err)
	fence, err := a.Alloc(2*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(first))
	require.NoError(t, a.EmptyCache()) // a 20 MiB hole before fence
	made := a.Stats().PagesCreated
	again, err := a.Alloc(20*mib, 0)
	require.NoError(t, err)
	require.Equal(t, first, again, "back into the hole")
	require.Equal(t, made+10, a.Stats().PagesCreated, "ten pages of their own inside the segment")
	made = a.Stats().PagesCreated
	past, err := a.Alloc(20*mib, 0)
	require.NoError(t, err)
	require.Equal(t, made+1, a.Stats().PagesCreated, "one chunk at the frontier")
	for _, p := range []vmm.DevicePtr{again, fence, past} {
		require.NoError(t, a.Free(p))
	}
}

// TestChunksRecycle: under recycle_pages a growth past a freed chunk
// unmaps (and releases) the chunk whole before making its own: reserved
// peaks at what is live.
func TestChunksRecycle(t *testing.T) {
	cfg := recycleConfig(true)
	cfg.ChunkBytes = 64 * mib
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, cfg)
	freed, err := a.Alloc(40*mib, 0)
	require.NoError(t, err)
	fence, err := a.Alloc(2*mib, 0)
	require.NoError(t, err)
	require.NoError(t, a.Free(freed))
	grown, err := a.Alloc(60*mib, 0)
	require.NoError(t, err)
	st := a.Stats()
	require.Equal(t, int64(62*mib), st.ReservedBytes.All.Peak)
	require.Equal(t, int64(1), st.Unmaps, "the freed chunk, in one Unmap")
	require.Equal(t, int64(3), st.PagesCreated, "a chunk for each growth")
	require.Equal(t, 2, d.Usage().Handles)
	require.NoError(t, a.Free(grown))
	require.NoError(t, a.Free(fence))
}

// TestChunkMinBytes: under chunk_min_mb only a growth whose block has at
// least that much wholly inside its pages gets a chunk; a smaller one gets
// a page each (its pin lists pages, no spans).
func TestChunkMinBytes(t *testing.T) {
	cfg := chunkConfig(64 * mib)
	cfg.ChunkMinBytes = 8 * mib
	cfg.Shareable = true
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, cfg)
	small, err := a.Alloc(7*mib, 0) // 3 whole pages: 6 MiB
	require.NoError(t, err)
	require.EqualValues(t, 4, a.Stats().PagesCreated, "below the minimum: a page each")
	pin, err := a.PinBlock(small)
	require.NoError(t, err)
	require.Nil(t, pin.Spans)
	require.Len(t, pin.Pages, 4)
	require.NoError(t, pin.Unpin())
	big, err := a.Alloc(12*mib, 0) // starts in small's last page: 5 whole pages
	require.NoError(t, err)
	require.EqualValues(t, 4+2, a.Stats().PagesCreated, "at the minimum: one chunk and the last page")
	pin, err = a.PinBlock(big)
	require.NoError(t, err)
	require.Equal(t, []int{1, 5, 1}, pin.Spans, "small's last page, the chunk, the block's own last page")
	require.NoError(t, pin.Unpin())
	require.NoError(t, a.Free(big))
	require.NoError(t, a.Free(small))
}

// TestChunksPauseResume: a tag on chunks pauses (each chunk unmapped
// whole and released) and resumes with its contents.
func TestChunksPauseResume(t *testing.T) {
	e := newPaused(t, chunkConfig(8*mib))
	bs := e.allocTagged(tagSizes...)
	made := e.a.Stats().PagesCreated
	require.Less(t, made, int64(e.host.Usage().MappedBytes/(2*mib)), "some chunks of several pages")
	require.NoError(t, e.a.Pause(true, tagName))
	require.Zero(t, e.host.Usage().Handles, "every chunk released")
	require.Zero(t, e.host.Usage().Mappings)
	require.NoError(t, e.a.Resume(tagName))
	require.NoError(t, e.intact(bs))
	again := e.a.Stats().PagesCreated - made
	require.Positive(t, again)
	require.LessOrEqual(t, again, made, "resume maps each mapped run in chunks: no more than the growths made")
	for _, b := range bs {
		require.NoError(t, e.a.Free(b.ptr))
	}
}

// TestChunksSettleInALoop: a loop whose blocks turn over below what the
// allocator has held (a training step whose sizes change from step to
// step) splits the freed chunk once and then runs on pages, recycled from
// step to step: no new physical allocations after the first rounds, where
// chunks re-made at the frontier would be split and made again every
// round.
func TestChunksSettleInALoop(t *testing.T) {
	cfg := chunkConfig(64 * mib)
	cfg.RecyclePages = true
	d := vmmtest.HostDriver(t, 1<<30)
	a := newAlloc(t, d, cfg)
	big, err := a.Alloc(100*mib, 0)
	require.NoError(t, err)
	require.EqualValues(t, 2, a.Stats().PagesCreated, "two chunks")
	require.NoError(t, a.Free(big))
	sizes := [][]uint64{{30 * mib, 22 * mib, 40 * mib}, {26 * mib, 31 * mib, 36 * mib}}
	var created int64
	for round := range 8 {
		var ps []vmm.DevicePtr
		for _, size := range sizes[round%2] {
			p, err := a.Alloc(size, 0)
			require.NoError(t, err)
			ps = append(ps, p)
		}
		for _, p := range ps {
			require.NoError(t, a.Free(p))
		}
		st := a.Stats()
		if round == 1 {
			created = st.PagesCreated
		}
		if round > 1 {
			require.Equal(t, created, st.PagesCreated, "round %d: no new physical allocations", round)
		}
		require.LessOrEqual(t, st.ReservedBytes.All.Peak, int64(100*mib))
	}
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
	require.Zero(t, d.Usage().Handles)
}

// sharedChunks counts the chunks of a that hold an allocated block and
// free memory at once: no page of such a chunk can be unmapped or
// recycled until the block is freed.
func sharedChunks(t *testing.T, a *Allocator) int {
	t.Helper()
	snap := a.Snapshot()
	a.pages.mu.Lock()
	defer a.pages.mu.Unlock()
	n := 0
	for seg := range a.pages.mu.segs {
		sp := seg.Data.(*segPages)
		for i := 0; i < len(sp.spans); i++ {
			c, ok := sp.chunkAt(i)
			if !ok || sp.handles[i] == 0 {
				continue
			}
			lo := uint64(seg.Base) + uint64(c.first)*seg.PageSize
			hi := lo + uint64(c.n)*seg.PageSize
			var live, free bool
			for _, s := range snap.Segments {
				for _, b := range s.Blocks {
					if uint64(b.Ptr) < hi && uint64(b.Ptr)+b.Size > lo {
						live = live || b.State == "allocated"
						free = free || b.State == "free"
					}
				}
			}
			if live && free {
				n++
			}
			i = int(c.first + c.n - 1)
		}
	}
	return n
}

// TestGrowthEndsInNoFreeChunk: a growth into a hole may go on into the
// free block after the hole, but not end inside a chunk of it (a chunk
// shared by the block and free memory, whose pages could then be neither
// unmapped nor recycled until the block is freed). Layout, in pages: a
// live half page, a hole of 5 (a freed block's chunk, given back), a free
// block of 5.5 holding a 4-page chunk, a live half page. A request of 7
// pages fits no free block; with the free half page before the hole, the
// hole and the free block after it, it would end inside that chunk, so
// it grows elsewhere, and no chunk is shared.
func TestGrowthEndsInNoFreeChunk(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PackLongLived = false
	cfg.ChunkBytes = 64 * mib
	cfg.OOMMaxRetries = 0
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
	ps := cfg.LargePageSize
	ptrs, err := alloc(a, ps/2, 6*ps, 5*ps, ps/2)
	require.NoError(t, err)
	lead, h, c, fence := ptrs[0], ptrs[1], ptrs[2], ptrs[3]
	require.NoError(t, a.Free(h))
	require.NoError(t, a.EmptyCache())
	require.Equal(t, uint64(ps), mappedIn(a, h, 6*ps), "the hole: h's inside went back, its edge pages stay")
	require.NoError(t, a.Free(c))
	require.Zero(t, sharedChunks(t, a))
	r, err := a.Alloc(7*ps, 0)
	require.NoError(t, err)
	require.NotEqual(t, h, r, "not into the hole: it would end inside c's chunk")
	require.Zero(t, sharedChunks(t, a), "no chunk holds a live block and free memory")
	for _, p := range []vmm.DevicePtr{lead, fence, r} {
		require.NoError(t, a.Free(p))
	}
}
