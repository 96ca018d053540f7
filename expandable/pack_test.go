package expandable

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// packConfig is the default configuration with Config.PackLongLived set
// to pack and no chunks (a chunk a block would end inside is split, which
// moves where the next block can go: chunks_test.go covers that).
func packConfig(pack bool) Config {
	cfg := DefaultConfig()
	cfg.PackLongLived = pack
	cfg.ChunkBytes = 0
	cfg.OOMMaxRetries = 0
	return cfg
}

// settleChainsConfig is the default with Config.SettleChains.
func settleChainsConfig() Config {
	cfg := DefaultConfig()
	cfg.SettleChains = true
	return cfg
}

// packSizes: kvSize is not a whole number of pages (a KV-cache tensor's
// 5 MiB and a row), tmpSize a temporary's.
const kvSize, tmpSize = 5*mib + 512, 9*mib + 4096

// scatterFreed allocates n blocks of kvSize, each followed by a
// temporary of tmpSize, and frees them all: blocks of kvSize at scattered
// addresses wait in the exact-size lists, where best fit takes them.
func scatterFreed(t *testing.T, a *Allocator, n int) {
	t.Helper()
	var held []vmm.DevicePtr
	for range n {
		ps, err := alloc(a, kvSize, tmpSize)
		require.NoError(t, err)
		held = append(held, ps...)
	}
	for _, p := range held {
		require.NoError(t, a.Free(p))
	}
}

// TestPackLongLivedPacksByAddress: eight blocks of one size allocated in a
// row, each alive when the next comes. From the fifth on (the first four
// fill the key's context of three earlier sizes and its table entry) each
// is predicted long-lived and goes to the lowest free block that fits, so
// they lie side by side; without PackLongLived best fit hands out the
// freed blocks of their size, 14 MiB apart. After the rest is freed and
// the cache emptied, the packed blocks hold fewer pages.
func TestPackLongLivedPacksByAddress(t *testing.T) {
	reserved := map[bool]int64{}
	for _, pack := range []bool{false, true} {
		a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), packConfig(pack))
		scatterFreed(t, a, 8)
		ks, err := alloc(a, kvSize, kvSize, kvSize, kvSize, kvSize, kvSize, kvSize, kvSize)
		require.NoError(t, err)
		side := 0
		for i := 4; i+1 < len(ks); i++ {
			if ks[i+1] == ks[i].Add(kvSize) {
				side++
			}
		}
		if pack {
			require.Equal(t, 3, side, "blocks 5 to 8 lie side by side: %v", ks)
		} else {
			require.Zero(t, side, "best fit takes the freed blocks of the size: %v", ks)
		}
		require.NoError(t, a.EmptyCache())
		reserved[pack] = a.Stats().ReservedBytes.All.Current
		for _, p := range ks {
			require.NoError(t, a.Free(p))
		}
	}
	require.Less(t, reserved[true], reserved[false], "packed blocks share their partly used pages")
}

// TestPackLongLivedMapsNothingMore: a long-lived block is packed only into
// pages already mapped; where none fits it is placed as any request is.
// Blocks that all grow the range, and requests of whole pages (never
// predicted: they fill every page they touch), land where they land
// without PackLongLived, with the same maps.
func TestPackLongLivedMapsNothingMore(t *testing.T) {
	for _, sizes := range [][]uint64{
		{kvSize, kvSize, kvSize, kvSize, kvSize, kvSize, kvSize},
		{4 * mib, 4 * mib, 4 * mib, 4 * mib, 4 * mib, 4 * mib},
	} {
		var got [2][]vmm.DevicePtr
		var maps [2]uint64
		for i, pack := range []bool{false, true} {
			d := &countingDriver{Driver: vmmtest.HostDriver(t, 1<<30)}
			a := newAlloc(t, d, packConfig(pack))
			if sizes[0]%(2*mib) == 0 {
				scatterFreedWhole(t, a, sizes[0])
			}
			ps, err := alloc(a, sizes...)
			require.NoError(t, err)
			maps[i] = d.maps()
			base := baseOf(t, a, ps[0])
			for _, p := range ps {
				got[i] = append(got[i], p-base)
				require.NoError(t, a.Free(p))
			}
		}
		require.Equal(t, got[0], got[1], "sizes %v: placed as without PackLongLived", sizes)
		require.Equal(t, maps[0], maps[1], "sizes %v: the same maps", sizes)
	}
}

// scatterFreedWhole is scatterFreed for blocks of size, a whole number
// of pages.
func scatterFreedWhole(t *testing.T, a *Allocator, size uint64) {
	t.Helper()
	var held []vmm.DevicePtr
	for range 6 {
		ps, err := alloc(a, size, tmpSize)
		require.NoError(t, err)
		held = append(held, ps...)
	}
	for _, p := range held {
		require.NoError(t, a.Free(p))
	}
}

// countingDriver counts the driver's Map calls.
type countingDriver struct {
	vmm.Driver
	mu sync.Mutex
	n  uint64
}

func (d *countingDriver) Map(va vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) error {
	d.mu.Lock()
	d.n++
	d.mu.Unlock()
	return d.Driver.Map(va, size, h, offset)
}

func (d *countingDriver) maps() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// TestPackLongLivedNotInPrivatePools: a capture's private pool (a CUDA
// graph's memory) is laid out as without PackLongLived: a graph replays
// the addresses it was captured with, and nothing there is predicted.
func TestPackLongLivedNotInPrivatePools(t *testing.T) {
	var got [2][]vmm.DevicePtr
	for i, pack := range []bool{false, true} {
		a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), packConfig(pack))
		id := pid(2)
		require.NoError(t, a.BeginAllocateToPool(id, func(vmm.Stream) bool { return true }))
		scatterFreed(t, a, 8)
		ks, err := alloc(a, kvSize, kvSize, kvSize, kvSize, kvSize, kvSize, kvSize, kvSize)
		require.NoError(t, err)
		require.NoError(t, a.EndAllocateToPool(id))
		got[i] = make([]vmm.DevicePtr, len(ks))
		for j, p := range ks {
			got[i][j] = p - ks[0]
			require.NoError(t, a.Free(p))
		}
		require.NoError(t, a.ReleasePool(id))
	}
	require.Equal(t, got[0], got[1])
}

// TestPackLongLivedOutOfMemory: a request predicted long-lived that fits
// nowhere goes through the OOM policy as any other, fails with
// vmm.ErrOutOfMemory leaving nothing behind, and succeeds once memory is
// freed; the block it then gets is packed after the live ones.
func TestPackLongLivedOutOfMemory(t *testing.T) {
	d := vmmtest.HostDriver(t, 48*mib)
	a := newAlloc(t, d, packConfig(true))
	ks, err := alloc(a, kvSize, kvSize, kvSize, kvSize)
	require.NoError(t, err)
	big, err := a.Alloc(24*mib, 0)
	require.NoError(t, err)
	before := a.Stats()
	_, err = a.Alloc(kvSize, 0) // predicted long-lived (ks[3] is alive)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	after := a.Stats()
	require.Equal(t, before.AllocatedBytes.All.Current, after.AllocatedBytes.All.Current)
	require.NoError(t, a.Free(big))
	p, err := a.Alloc(kvSize, 0)
	require.NoError(t, err)
	require.Equal(t, ks[3].Add(kvSize), p, "packed after the last long-lived block, in the pages big freed")
	for _, q := range append(ks, p) {
		require.NoError(t, a.Free(q))
	}
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
}

// TestPackLongLivedConcurrent: goroutines on streams of their own (and
// two on the default stream) allocate and free long-lived and temporary
// blocks at once under PackLongLived, with chunks: under -race, and the
// heap's invariants and the blocks' disjointness hold.
func TestPackLongLivedConcurrent(t *testing.T) {
	t.Run("default", func(t *testing.T) { packConcurrent(t, DefaultConfig()) })
	t.Run("settle chains", func(t *testing.T) { packConcurrent(t, settleChainsConfig()) })
}

func packConcurrent(t *testing.T, cfg Config) {
	d := vmmtest.HostDriver(t, 8<<30)
	cfg.OOMMaxRetries = 0
	a := newAlloc(t, d, cfg)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for g := range errs {
		s := vmm.Stream(0)
		if g >= 2 {
			var err error
			s, err = d.StreamCreate(0)
			require.NoError(t, err)
			t.Cleanup(func() { _ = d.StreamDestroy(s) })
		}
		wg.Go(func() { errs[g] = packSteps(a, s, uint64(g)) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Zero(t, a.Stats().AllocatedBytes.All.Current)
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
}

// packSteps is one goroutine of TestPackLongLivedConcurrent: 40 steps,
// each a temporary and a block kept for five steps, sizes varied by g
// and the step.
func packSteps(a *Allocator, s vmm.Stream, g uint64) (err error) {
	var kv []vmm.DevicePtr
	defer func() {
		for _, k := range kv {
			err = errors.Join(err, a.Free(k))
		}
	}()
	for step := range uint64(40) {
		tmp, err := a.Alloc(tmpSize+g*4096, s)
		if err != nil {
			return err
		}
		k, err := a.Alloc(kvSize+step%7*512, s)
		if err != nil {
			return errors.Join(err, a.Free(tmp))
		}
		kv = append(kv, k)
		if err := a.Free(tmp); err != nil {
			return err
		}
		if len(kv) > 5 {
			if err := a.Free(kv[0]); err != nil {
				return err
			}
			kv = kv[1:]
		}
	}
	return nil
}

// packFaultScenario: a request predicted long-lived that no mapped free
// block fits grows the range as any request does, recycling the freed
// pages before it: each driver call of that growth fails in turn
// (TestFaultMatrix runs it).
func packFaultScenario(held *[]vmm.DevicePtr) vmmtest.Scenario {
	cfg := recycleConfig(true)
	cfg.PackLongLived = true
	return allocScenario("pack-long-lived-grow", cfg,
		func(a *Allocator) error {
			var err error
			if *held, err = alloc(a, 4*mib, kvSize, kvSize, kvSize, kvSize); err != nil {
				return err
			}
			return a.Free((*held)[0])
		},
		func(a *Allocator) error { _, err := a.Alloc(kvSize, 0); return err },
		func(a *Allocator) error { return allocFree(a, kvSize) })
}

// chainLayout sets up a request predicted long-lived (req, 5 pages and
// 512 bytes) whose packed place, b, starts on a page boundary above a
// hole that follows a free block p starting mid-page right after a live
// block, p and the hole fitting req: it continues the live block's pages
// through the hole (chainHoleLocked). In pages: a live half page, p (2.5
// pages), a hole of 5, a free half page, a live half page, b (6 pages),
// a live half page, four live blocks of req's size. It returns the live
// blocks and p.
func chainLayout(a *Allocator) (held []vmm.DevicePtr, p vmm.DevicePtr, err error) {
	ps := a.heap.Config().LargePageSize
	ptrs, err := alloc(a, ps/2, 2*ps, 6*ps, ps/2, 6*ps, ps/2)
	if err != nil {
		return nil, 0, err
	}
	reqs, err := alloc(a, chainReq, chainReq, chainReq, chainReq)
	if err != nil {
		return nil, 0, err
	}
	held = append(reqs, ptrs[0], ptrs[3], ptrs[5])
	err = errors.Join(a.Free(ptrs[2]), a.EmptyCache(), a.Free(ptrs[1]), a.Free(ptrs[4]))
	return held, ptrs[1], err
}

const chainReq = 5*2*mib + 512

// TestPackLongLivedChainsThroughAHole: the request goes to p, grown into
// the hole after it (three pages mapped, recycled from the top of b),
// not to b.
func TestPackLongLivedChainsThroughAHole(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), packConfig(true))
	held, p, err := chainLayout(a)
	require.NoError(t, err)
	created := a.Stats().PagesCreated
	r, err := a.Alloc(chainReq, 0)
	require.NoError(t, err)
	require.Equal(t, p, r, "p and the hole after it")
	require.Equal(t, created, a.Stats().PagesCreated, "the hole's pages are recycled, none made")
	for _, q := range append(held, r) {
		require.NoError(t, a.Free(q))
	}
}

// packChainFaultScenario: the growth of TestPackLongLivedChainsThroughAHole
// (an unmap of b's top pages, then a map into the hole) with each driver
// call failing in turn (TestFaultMatrix runs it): the request fails
// cleanly or is placed as any other. With settle, under
// Config.SettleChains, whose books (the pages a chain mapped) must follow
// only the map that succeeded (the invariant checker holds them).
func packChainFaultScenario(held *[]vmm.DevicePtr, settle bool) vmmtest.Scenario {
	cfg, name := packConfig(true), "pack-long-lived-chain"
	if settle {
		cfg.SettleChains, name = true, name+"-settle"
	}
	return allocScenario(name, cfg,
		func(a *Allocator) error {
			var err error
			*held, _, err = chainLayout(a)
			return err
		},
		func(a *Allocator) error { _, err := a.Alloc(chainReq, 0); return err },
		func(a *Allocator) error { return allocFree(a, chainReq) })
}

// TestPackLongLivedPassesOverChunks: three free blocks fit a request
// predicted long-lived: the lowest a chunk (one physical allocation of
// 40 MiB) the request would end inside, one of pages above it, and a
// smaller one of pages above that. Best fit takes the smallest; packing
// takes the lowest it can have without splitting the chunk (which
// would unmap it and map its pages one by one), the middle one, and
// unmaps nothing.
func TestPackLongLivedPassesOverChunks(t *testing.T) {
	const req = 2*mib + 512
	const chunk, mid, small, fence = 40 * mib, 3 * mib, 2*mib + 4096, 1 * mib
	for _, pack := range []bool{false, true} {
		cfg := packConfig(pack)
		cfg.ChunkBytes = 64 * mib
		a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
		c, err := a.Alloc(chunk, 0)
		require.NoError(t, err)
		require.EqualValues(t, 1, a.Stats().PagesCreated, "a growth at the frontier: one chunk")
		ps, err := alloc(a, fence, mid, fence, small, fence)
		require.NoError(t, err)
		m, s := ps[1], ps[3]
		require.Less(t, c, m)
		require.Less(t, m, s)
		// Four requests of req in a row, alive: the fourth leaves its key
		// (req after three of req) in the table with a live block.
		held, err := alloc(a, req, req, req, req)
		require.NoError(t, err)
		for _, p := range []vmm.DevicePtr{c, m, s} {
			require.NoError(t, a.Free(p))
		}
		unmaps := a.Stats().Unmaps
		p, err := a.Alloc(req, 0)
		require.NoError(t, err)
		if pack {
			require.Equal(t, m, p, "the lowest free block it ends in no chunk of")
		} else {
			require.Equal(t, s, p, "best fit: the smallest free block")
		}
		require.Equal(t, unmaps, a.Stats().Unmaps, "no chunk split")
		for _, q := range append(append(held, p), ps[0], ps[2], ps[4]) {
			require.NoError(t, a.Free(q))
		}
	}
}

// TestPackLongLivedPredictsOnce: each request of a page or more is
// predicted once, whichever path serves it: Alloc's warm path (a parked
// block of its size), or the slow path after the warm path found none
// (predicting again there would move the context twice and change
// every key after it). Requests under a page are never predicted.
func TestPackLongLivedPredictsOnce(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), packConfig(true))
	var held []vmm.DevicePtr
	large := uint64(0)
	for i := range 6 {
		// A temporary freed at once: parked, so that the next turn's
		// takes the warm path.
		p, err := a.Alloc(tmpSize, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(p))
		small, err := a.Alloc(64<<10, 0)
		require.NoError(t, err)
		k, err := a.Alloc(kvSize, 0) // kept: nothing of its size is parked
		require.NoError(t, err)
		held = append(held, small, k)
		large += 2
		predicted, long := a.heap.PackCounts()
		require.Equal(t, large, predicted, "turn %d: one prediction a request of a page or more", i)
		// Keys: the temporary's (tmp after kv, tmp, kv) from the third
		// turn on finds the last temporary freed: never long-lived. The
		// KV block's (kv after tmp, kv, tmp) from the third turn on finds
		// the last KV block alive: long-lived.
		require.Equal(t, uint64(max(0, i-1)), long, "turn %d", i)
	}
	// Blocks served by the warm path are recorded too: six blocks of a
	// new size parked (each between two kept ones), then six requests of
	// it kept. The first four take parked blocks on the warm path; the
	// fourth's key (the size after three of it) is the fifth's and
	// sixth's, whose last block is alive: both predicted long-lived.
	const size = 3*mib + 512
	var parked []vmm.DevicePtr
	for range 6 {
		ps, err := alloc(a, size, tmpSize)
		require.NoError(t, err)
		parked = append(parked, ps[0])
		held = append(held, ps[1])
	}
	for _, p := range parked {
		require.NoError(t, a.Free(p))
	}
	_, before := a.heap.PackCounts()
	for range 6 {
		p, err := a.Alloc(size, 0)
		require.NoError(t, err)
		held = append(held, p)
	}
	_, after := a.heap.PackCounts()
	require.Equal(t, before+2, after, "the fifth and sixth found the fourth alive")
	for _, p := range held {
		require.NoError(t, a.Free(p))
	}
}

// mappedIn reports how many bytes of [lo, lo+size) a snapshot of a shows
// mapped.
func mappedIn(a *Allocator, lo vmm.DevicePtr, size uint64) uint64 {
	var n uint64
	for _, s := range a.Snapshot().Segments {
		for _, r := range s.Mapped {
			a0, a1 := max(uint64(lo), uint64(r.Ptr)), min(uint64(lo)+size, uint64(r.Ptr)+r.Size)
			if a1 > a0 {
				n += a1 - a0
			}
		}
	}
	return n
}

// TestRecycleTakesFromTheTop: a growth that recycles free pages takes
// them from the highest free block first, and of the last block it takes
// from, the pages at its top: the low free block keeps the pages next to
// the live block before it, where the next block goes (unmapPassLocked).
// Free blocks of 4 pages at A and C, live blocks between and after; a
// growth of 5 pages takes C's 4 and A's top page.
func TestRecycleTakesFromTheTop(t *testing.T) {
	cfg := packConfig(true)
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
	ps := cfg.LargePageSize
	ptrs, err := alloc(a, 4*ps, 4*ps, 4*ps, 4*ps)
	require.NoError(t, err)
	for i := 1; i < len(ptrs); i++ {
		require.Equal(t, ptrs[i-1].Add(4*ps), ptrs[i], "side by side from the range's start")
	}
	require.NoError(t, a.Free(ptrs[0]))
	require.NoError(t, a.Free(ptrs[2]))
	before := a.Stats().PagesCreated
	d, err := alloc(a, 5*ps)
	require.NoError(t, err)
	require.Equal(t, ptrs[3].Add(4*ps), d[0], "the growth goes past the last live block")
	require.Equal(t, before, a.Stats().PagesCreated, "the growth recycles free pages, makes none")
	require.Zero(t, mappedIn(a, ptrs[2], 4*ps), "the highest free block goes first, whole")
	require.Equal(t, 3*ps, mappedIn(a, ptrs[0], 4*ps), "then one page of the lowest")
	require.Equal(t, 3*ps, mappedIn(a, ptrs[0], 3*ps), "from its top: its start stays mapped")
}

// TestPackLongLivedChainsNoChunk: packing passes over a free block that a
// request predicted long-lived would end inside a chunk of (p below) and
// takes a higher one (b). A hole right after p must not draw the request
// back into p: it fits in p alone, so growing into the hole would map a
// page it does not use and leave p's chunk shared by the block and free
// memory (chainHoleLocked). Layout, in pages: a live half page, p (8.5
// pages from mid-page: a 7-page chunk and a page), a hole of 3, a free
// half page, a live half page, b (6 pages of their own), a live half
// page, four live blocks of the request's size.
func TestPackLongLivedChainsNoChunk(t *testing.T) {
	cfg := packConfig(true)
	cfg.ChunkBytes = 64 * mib
	cfg.ChunkMinBytes = 14 * mib // the 7 pages inside p's block, not b's 6
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), cfg)
	ps := cfg.LargePageSize
	req := 5*ps + 512
	ptrs, err := alloc(a, ps/2, 8*ps, 4*ps, ps/2, 6*ps, ps/2)
	require.NoError(t, err)
	k, h, bb := ptrs[1], ptrs[2], ptrs[4]
	require.Equal(t, k.Add(8*ps), h)
	require.Zero(t, uint64(bb-ptrs[0])%uint64(ps), "b starts on a page boundary")
	held, err := alloc(a, req, req, req, req) // the request's key, alive
	require.NoError(t, err)
	require.NoError(t, a.Free(h))
	require.NoError(t, a.EmptyCache())
	require.Equal(t, uint64(ps), mappedIn(a, h, 4*ps), "h's inside went back: the hole")
	require.NoError(t, a.Free(k))
	require.NoError(t, a.Free(bb))
	require.Zero(t, sharedChunks(t, a))
	maps := a.Stats().Maps
	p, err := a.Alloc(req, 0)
	require.NoError(t, err)
	_, long := a.heap.PackCounts()
	require.NotZero(t, long, "predicted long-lived")
	require.Equal(t, bb, p, "the lowest free block it ends in no chunk of")
	require.Equal(t, maps, a.Stats().Maps, "nothing mapped")
	require.Zero(t, sharedChunks(t, a), "no chunk holds a live block and free memory")
	for _, q := range append(held, p, ptrs[0], ptrs[3], ptrs[5]) {
		require.NoError(t, a.Free(q))
	}
}
