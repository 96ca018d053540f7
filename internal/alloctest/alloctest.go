// Package alloctest is the conformance suite of xseg's allocators: one set
// of tests that every Allocator passes on every backend (the host backend in
// CI, CUDA on a GPU machine). It checks the contract of xseg.Allocator with
// real memory: blocks never overlap (each block is filled with its own
// pattern through the driver and read back), bad input is refused without
// corrupting anything, stream-ordered reuse holds with real streams, stats
// add up, and nothing leaks after Close.
package alloctest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// Config says how to make the allocator under test.
type Config struct {
	// Name prefixes the subtests.
	Name string
	// Driver opens a fresh driver for one subtest; the suite closes it.
	Driver func(t testing.TB) vmm.Driver
	// Open makes an allocator over d (not closing d on Close).
	Open func(t testing.TB, d vmm.Driver) xseg.Allocator
	// Device is the device under test.
	Device vmm.Device
}

type fixture struct {
	t *testing.T
	d vmm.Driver
	a xseg.Allocator
	// open makes another allocator over d, closed when the subtest
	// ends, before the suite checks that d holds nothing.
	open func() xseg.Allocator
}

// Run runs the suite.
func Run(t *testing.T, c Config) {
	tests := []struct {
		name string
		fn   func(f *fixture)
	}{
		{"NoOverlap", testNoOverlap},
		{"BadInput", testBadInput},
		{"StatsAddUp", testStats},
		{"EmptyCacheReturnsPages", testEmptyCache},
		{"StreamOrderedReuse", testStreamOrderedReuse},
		{"Concurrent", testConcurrent},
		{"TwoAllocatorsAtOnce", testTwoAllocators},
		{"AllocAtMost", testAllocAtMost},
		{"OutOfMemory", testOutOfMemory},
		{"CloseReleasesAll", testClose},
	}
	for _, tc := range tests {
		t.Run(c.Name+"/"+tc.name, func(t *testing.T) {
			d := c.Driver(t)
			a := c.Open(t, d)
			t.Cleanup(func() {
				require.NoError(t, a.Close())
				u := d.Usage()
				require.Zero(t, u.Handles, "pages left after Close: %v", u)
				require.Zero(t, u.Mappings, "mappings left after Close: %v", u)
				require.Zero(t, u.Ranges, "ranges left after Close: %v", u)
				require.Zero(t, u.Allocs, "plain allocations left after Close: %v", u)
				require.Zero(t, u.Events, "events left after Close: %v", u)
				require.NoError(t, d.Close())
			})
			open := func() xseg.Allocator {
				b := c.Open(t, d)
				t.Cleanup(func() { require.NoError(t, b.Close()) })
				return b
			}
			tc.fn(&fixture{t: t, d: d, a: a, open: open})
		})
	}
}

// pattern is the content the suite writes into block i.
func pattern(i int, n uint64) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*131 + j*7 + 1)
	}
	return b
}

// fill writes block i's pattern over the first and last up-to-4 KiB of the
// block (whole for small blocks), which is where an overlap would show.
func (f *fixture) fill(i int, p vmm.DevicePtr, size uint64) {
	for _, off := range edges(size) {
		n := min(size-off, 4096)
		require.NoError(f.t, f.d.CopyHtoD(p.Add(off), pattern(i+int(off), n)))
	}
}

func (f *fixture) check(i int, p vmm.DevicePtr, size uint64) {
	for _, off := range edges(size) {
		n := min(size-off, 4096)
		got := make([]byte, n)
		require.NoError(f.t, f.d.CopyDtoH(got, p.Add(off)))
		if !bytes.Equal(got, pattern(i+int(off), n)) {
			f.t.Fatalf("block %d at %v+%d: contents changed (another block overlaps it)", i, p, off)
		}
	}
}

func edges(size uint64) []uint64 {
	if size <= 4096 {
		return []uint64{0}
	}
	return []uint64{0, size - 4096}
}

var sizes = []uint64{1, 511, 512, 513, 4096, 100_000, 1 << 20, 1<<20 + 1, 3 << 20, 20 << 20, 21<<20 + 5, 64 << 20}

func testNoOverlap(f *fixture) {
	type blk struct {
		p    vmm.DevicePtr
		size uint64
	}
	var live []blk
	for round := 0; round < 3; round++ {
		for _, s := range sizes {
			p, err := f.a.Alloc(s, 0)
			require.NoError(f.t, err, "Alloc(%d)", s)
			live = append(live, blk{p, s})
			f.fill(len(live)-1, p, s)
		}
		// Free every other block, so later rounds reuse holes.
		kept := live[:0]
		for i, b := range live {
			f.check(i, b.p, b.size)
			if i%2 == 1 {
				require.NoError(f.t, f.a.Free(b.p))
				continue
			}
			kept = append(kept, b)
		}
		live = kept
		for i, b := range live {
			f.fill(i, b.p, b.size)
		}
	}
	for i, b := range live {
		f.check(i, b.p, b.size)
		require.NoError(f.t, f.a.Free(b.p))
	}
	require.Zero(f.t, f.a.Stats().AllocatedBytes.All.Current)
}

func testBadInput(f *fixture) {
	_, err := f.a.Alloc(0, 0)
	require.ErrorIs(f.t, err, vmm.ErrInvalid, "Alloc(0)")
	_, total, err := f.d.MemInfo(0)
	require.NoError(f.t, err)
	_, err = f.a.Alloc(total+1<<30, 0)
	require.ErrorIs(f.t, err, vmm.ErrOutOfMemory, "Alloc beyond the device")
	_, err = f.a.Alloc(^uint64(0)-1000, 0)
	require.Error(f.t, err, "Alloc of 2^64-1000 bytes")

	p, err := f.a.Alloc(8192, 0)
	require.NoError(f.t, err)
	f.fill(0, p, 8192)
	before := f.a.Stats()
	require.ErrorIs(f.t, f.a.Free(p+512), vmm.ErrInvalid, "interior pointer")
	require.ErrorIs(f.t, f.a.Free(0xdead0000), vmm.ErrInvalid, "unknown pointer")
	require.ErrorIs(f.t, f.a.RecordStream(0xdead0000, 0), vmm.ErrInvalid, "record stream of unknown pointer")
	require.Equal(f.t, before.AllocatedBytes, f.a.Stats().AllocatedBytes, "a refused Free changed the stats")
	f.check(0, p, 8192)
	require.NoError(f.t, f.a.Free(p))
	require.ErrorIs(f.t, f.a.Free(p), vmm.ErrInvalid, "double free")
	require.Zero(f.t, f.a.Stats().AllocatedBytes.All.Current)
}

func testStats(f *fixture) {
	var ptrs []vmm.DevicePtr
	var req uint64
	for _, s := range sizes {
		p, err := f.a.Alloc(s, 0)
		require.NoError(f.t, err)
		ptrs = append(ptrs, p)
		req += s
	}
	st := f.a.Stats()
	require.EqualValues(f.t, len(sizes), st.Allocations.All.Current)
	require.EqualValues(f.t, req, st.RequestedBytes.All.Current)
	require.GreaterOrEqual(f.t, st.AllocatedBytes.All.Current, int64(req))
	require.Zero(f.t, st.AllocatedBytes.All.Current%512, "allocated bytes are whole 512-byte units")
	require.GreaterOrEqual(f.t, st.ReservedBytes.All.Current, st.AllocatedBytes.All.Current)
	require.Equal(f.t, st.AllocatedBytes.All.Current, st.AllocatedBytes.Small.Current+st.AllocatedBytes.Large.Current)
	peak := st.AllocatedBytes.All.Peak
	for _, p := range ptrs {
		require.NoError(f.t, f.a.Free(p))
	}
	st = f.a.Stats()
	require.Zero(f.t, st.AllocatedBytes.All.Current)
	require.Zero(f.t, st.Allocations.All.Current)
	require.Zero(f.t, st.RequestedBytes.All.Current)
	require.Equal(f.t, peak, st.AllocatedBytes.All.Peak)
	f.a.ResetPeakStats()
	require.Zero(f.t, f.a.Stats().AllocatedBytes.All.Peak)

	// Accumulated totals go to zero; current values and peaks stay.
	keep, err := f.a.Alloc(3<<20, 0)
	require.NoError(f.t, err)
	before := f.a.Stats()
	require.Positive(f.t, before.Allocations.All.Allocated)
	require.Positive(f.t, before.AllocatedBytes.All.Freed)
	f.a.ResetAccumulatedStats()
	after := f.a.Stats()
	require.Zero(f.t, after.Allocations.All.Allocated)
	require.Zero(f.t, after.AllocatedBytes.All.Freed)
	require.Zero(f.t, after.ReservedBytes.Large.Allocated)
	require.Zero(f.t, after.Maps+after.PagesCreated+after.NumAllocRetries+after.NumOOMs)
	require.Equal(f.t, before.AllocatedBytes.All.Current, after.AllocatedBytes.All.Current)
	require.Equal(f.t, before.AllocatedBytes.All.Peak, after.AllocatedBytes.All.Peak)
	require.Equal(f.t, before.ReservedBytes.All.Current, after.ReservedBytes.All.Current)
	require.Equal(f.t, before.ReservedBytes.Large.Peak, after.ReservedBytes.Large.Peak)
	require.NoError(f.t, f.a.Free(keep))
	require.EqualValues(f.t, 1, f.a.Stats().Allocations.All.Freed, "counting goes on from zero")
}

func testEmptyCache(f *fixture) {
	for round := 0; round < 2; round++ {
		var ptrs []vmm.DevicePtr
		for _, s := range sizes {
			p, err := f.a.Alloc(s, 0)
			require.NoError(f.t, err)
			ptrs = append(ptrs, p)
		}
		require.Positive(f.t, f.d.Usage().Handles+f.d.Usage().Allocs)
		for _, p := range ptrs {
			require.NoError(f.t, f.a.Free(p))
		}
		require.NoError(f.t, f.a.EmptyCache())
		u := f.d.Usage()
		require.Zero(f.t, u.Handles, "pages held after EmptyCache: %v", u)
		require.Zero(f.t, u.Mappings, "mappings after EmptyCache: %v", u)
		require.Zero(f.t, u.Allocs, "plain allocations after EmptyCache: %v", u)
		require.Zero(f.t, f.a.Stats().ReservedBytes.All.Current)
	}
}

func testConcurrent(f *fixture) {
	const workers, iters = 8, 150
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []vmm.DevicePtr
			for i := 0; i < iters; i++ {
				if len(mine) > 0 && r.IntN(3) == 0 {
					k := r.IntN(len(mine))
					if err := f.a.Free(mine[k]); err != nil {
						errs <- err
						return
					}
					mine = append(mine[:k], mine[k+1:]...)
					continue
				}
				s := sizes[r.IntN(len(sizes)-2)]
				p, err := f.a.Alloc(s, 0)
				if err != nil {
					errs <- err
					return
				}
				tag := []byte{byte(w), byte(i)}
				if err := f.d.CopyHtoD(p, tag); err != nil {
					errs <- err
					return
				}
				got := make([]byte, 2)
				if err := f.d.CopyDtoH(got, p); err != nil || !bytes.Equal(got, tag) {
					errs <- fmt.Errorf("worker %d: block %v was overwritten (err %v)", w, p, err)
					return
				}
				mine = append(mine, p)
			}
			for _, p := range mine {
				if err := f.a.Free(p); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		f.t.Fatal(err)
	}
	require.Zero(f.t, f.a.Stats().AllocatedBytes.All.Current)
}

// testTwoAllocators runs two allocators over one driver, each from two
// goroutines at once, as two libraries of one process might: blocks grow,
// are freed and given back (EmptyCache) in both, so that one maps pages
// while the other unmaps its own. No block of either may change under the
// other, and each ends with nothing allocated.
func testTwoAllocators(f *fixture) {
	allocs := []xseg.Allocator{f.a, f.open()}
	big := []uint64{4096, 1<<20 + 1, 3 << 20, 21<<20 + 5, 64 << 20}
	const perAlloc, iters = 2, 60
	var wg sync.WaitGroup
	errs := make(chan error, len(allocs)*perAlloc)
	for ai, a := range allocs {
		for g := 0; g < perAlloc; g++ {
			wg.Add(1)
			go func(id int, a xseg.Allocator) {
				defer wg.Done()
				errs <- twoAllocWorker(f.d, a, id, big, iters)
			}(ai*perAlloc+g, a)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(f.t, err)
	}
	for i, a := range allocs {
		st := a.Stats()
		require.Zero(f.t, st.AllocatedBytes.All.Current, "allocator %d", i)
		require.NoError(f.t, a.EmptyCache())
		require.Zero(f.t, a.Stats().ReservedBytes.All.Current, "allocator %d after EmptyCache", i)
	}
}

// twoAllocWorker allocates, tags, checks and frees blocks of sizes on a,
// emptying a's cache now and then; worker id's tags are its own.
func twoAllocWorker(d vmm.Driver, a xseg.Allocator, id int, sizes []uint64, iters int) error {
	r := rand.New(rand.NewPCG(uint64(id), 11))
	type held struct {
		p    vmm.DevicePtr
		size uint64
		tag  []byte
	}
	var mine []held
	check := func(h held) error {
		for _, off := range edges(h.size) {
			got := make([]byte, len(h.tag))
			if err := d.CopyDtoH(got, h.p.Add(off)); err != nil {
				return err
			}
			if !bytes.Equal(got, h.tag) {
				return fmt.Errorf("worker %d: block %v+%d of %d bytes changed: %x, want %x", id, h.p, off, h.size, got, h.tag)
			}
		}
		return nil
	}
	for i := 0; i < iters; i++ {
		switch {
		case i%15 == 14:
			if err := a.EmptyCache(); err != nil {
				return fmt.Errorf("worker %d: EmptyCache: %w", id, err)
			}
		case len(mine) > 0 && r.IntN(3) == 0:
			k := r.IntN(len(mine))
			if err := check(mine[k]); err != nil {
				return err
			}
			if err := a.Free(mine[k].p); err != nil {
				return err
			}
			mine = append(mine[:k], mine[k+1:]...)
		default:
			size := sizes[r.IntN(len(sizes))]
			p, err := a.Alloc(size, 0)
			if err != nil {
				return fmt.Errorf("worker %d: Alloc(%d): %w", id, size, err)
			}
			h := held{p, size, []byte{byte(id), byte(i), 0x5a, byte(i >> 8)}}
			for _, off := range edges(size) {
				if err := d.CopyHtoD(p.Add(off), h.tag); err != nil {
					return err
				}
			}
			mine = append(mine, h)
		}
	}
	for _, h := range mine {
		if err := check(h); err != nil {
			return err
		}
		if err := a.Free(h.p); err != nil {
			return err
		}
	}
	return nil
}

func testAllocAtMost(f *fixture) {
	p, n, err := f.a.AllocAtMost(8<<20, 1<<20, 0)
	require.NoError(f.t, err)
	require.Equal(f.t, uint64(8<<20), n, "plenty of memory: AllocAtMost gives max")
	require.NoError(f.t, f.a.Free(p))
	_, total, err := f.d.MemInfo(0)
	require.NoError(f.t, err)
	p, n, err = f.a.AllocAtMost(total*2, 1<<20, 0)
	require.NoError(f.t, err)
	require.GreaterOrEqual(f.t, n, uint64(1<<20))
	require.Less(f.t, n, total*2)
	require.NoError(f.t, f.a.Free(p))
	_, _, err = f.a.AllocAtMost(1<<20, 2<<20, 0)
	require.ErrorIs(f.t, err, vmm.ErrInvalid, "min > max")
}

func testOutOfMemory(f *fixture) {
	free, total, err := f.d.MemInfo(0)
	require.NoError(f.t, err)
	_, err = f.a.Alloc(total+(64<<20), 0)
	require.ErrorIs(f.t, err, vmm.ErrOutOfMemory)
	require.Contains(f.t, err.Error(), fmt.Sprint(total+(64<<20)), "the error names the requested size")
	// A request that fits the device but not what is free after a big
	// block: hold most of the free memory, then ask for more than remains.
	hold := (free / 4 * 3) &^ (64<<20 - 1)
	if hold == 0 {
		return
	}
	p, err := f.a.Alloc(hold, 0)
	require.NoError(f.t, err)
	_, err = f.a.Alloc(free-hold+(256<<20), 0)
	require.ErrorIs(f.t, err, vmm.ErrOutOfMemory)
	require.Positive(f.t, f.a.Stats().NumOOMs)
	require.NoError(f.t, f.a.Free(p))
	// After the failure the allocator still works.
	q, err := f.a.Alloc(4<<20, 0)
	require.NoError(f.t, err)
	require.NoError(f.t, f.a.Free(q))
}

func testClose(f *fixture) {
	for _, s := range sizes[:6] {
		_, err := f.a.Alloc(s, 0)
		require.NoError(f.t, err)
	}
	require.NoError(f.t, f.a.Close())
	require.NoError(f.t, f.a.Close(), "Close is idempotent")
	_, err := f.a.Alloc(512, 0)
	require.True(f.t, errors.Is(err, vmm.ErrClosed), "Alloc after Close: %v", err)
}

// testStreamOrderedReuse: a block used on a second stream (RecordStream) is
// not handed out again while that stream's work queued before the free is
// still running. With CUDA the work is real: gigabytes of memset queued on
// the side stream keep it busy for tens of milliseconds.
func testStreamOrderedReuse(f *fixture) {
	side, err := f.d.StreamCreate(0)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { require.NoError(f.t, f.d.StreamDestroy(side)) })
	done, err := f.d.EventCreate(0)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { require.NoError(f.t, f.d.EventDestroy(done)) })

	const busySize = 256 << 20
	busy, err := f.a.Alloc(busySize, side)
	require.NoError(f.t, err)
	x, err := f.a.Alloc(4<<20, 0)
	require.NoError(f.t, err)
	require.NoError(f.t, f.a.RecordStream(x, side))
	rounds := 200 // about 50 GiB of writes on the side stream of a GPU
	if f.d.Backend() == "host" {
		rounds = 1 // synchronous streams: the work is done before the free
	}
	for i := 0; i < rounds; i++ {
		require.NoError(f.t, vmmtest.MemsetAsync(f.d, busy, byte(i), busySize, side))
	}
	require.NoError(f.t, vmmtest.MemsetAsync(f.d, x, 0xab, 4<<20, side))
	require.NoError(f.t, f.d.EventRecord(done, side))
	require.NoError(f.t, f.a.Free(x))

	y, err := f.a.Alloc(4<<20, 0)
	require.NoError(f.t, err)
	finished, err := f.d.EventQuery(done)
	require.NoError(f.t, err)
	if !finished {
		require.NotEqual(f.t, x, y, "a block still in use on another stream was handed out again")
		st := f.a.Stats()
		require.Greater(f.t, st.ActiveBytes.All.Current, st.AllocatedBytes.All.Current,
			"the freed block is pending, so active bytes exceed allocated bytes")
	} else {
		f.t.Logf("the side stream finished before the check (synchronous backend): ordering not observable")
	}
	require.NoError(f.t, f.d.StreamSynchronize(side))
	require.NoError(f.t, f.a.Free(y))
	z, err := f.a.Alloc(4<<20, 0) // polls the completed event
	require.NoError(f.t, err)
	st := f.a.Stats()
	require.Equal(f.t, st.AllocatedBytes.All.Current, st.ActiveBytes.All.Current, "nothing pending once the stream is idle")
	require.NoError(f.t, f.a.Free(z))
	require.NoError(f.t, f.a.Free(busy))
	// Give the side stream's pages back while the stream still exists: the
	// cleanups destroy it before the allocator is closed.
	require.NoError(f.t, f.a.EmptyCache())
}
