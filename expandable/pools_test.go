package expandable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// Tests of the private pools (xseg.Pools) of the expandable allocator: the
// memory of CUDA graph captures. They run on the host backend, whose
// streams are synchronous; the capture tests wrap it in vmmtest.CaptureGuard, which
// fails (and records) every driver call that stream capture forbids while
// the test has a pool active, and can hold events incomplete.

func pid(n uint64) core.PoolID { return core.PoolID{First: 0, Second: n} }

// onStream is PyTorch's capture filter: it accepts the capturing stream.
func onStream(s vmm.Stream) func(vmm.Stream) bool {
	return func(x vmm.Stream) bool { return x == s }
}

// forbiddenOps are the operations counted by poolEnv.forbidden.
var forbiddenOps = []vmmtest.Op{vmmtest.OpEventQuery, vmmtest.OpEventRecord, vmmtest.OpEventSynchronize,
	vmmtest.OpStreamSynchronize, vmmtest.OpDeviceSynchronize, vmmtest.OpUnmap, vmmtest.OpMemFree}

// poolEnv is an allocator over Faulty(vmmtest.CaptureGuard(host)) with a capture
// stream s and a side stream.
type poolEnv struct {
	t       *testing.T
	host    *host.Driver
	g       *vmmtest.CaptureGuard
	f       *vmmtest.Faulty
	log     *vmmtest.LogRecorder
	a       *Allocator
	s, side vmm.Stream
}

func newPoolEnv(t *testing.T, capacity uint64, cfg Config) *poolEnv {
	t.Helper()
	hd := vmmtest.HostDriver(t, capacity)
	env, a := vmmtest.NewCaptureEnv(t, hd, func(d vmm.Driver, log *slog.Logger) (*Allocator, error) {
		return New(d, 0, cfg, log)
	})
	return &poolEnv{t: t, host: hd, g: env.G, f: env.F, log: env.Log, a: a, s: env.S, side: env.Side}
}

// begin begins a capture into pool id and arms the guard.
func (e *poolEnv) begin(id core.PoolID, filter func(vmm.Stream) bool) {
	e.t.Helper()
	require.NoError(e.t, e.a.BeginAllocateToPool(id, filter))
	e.g.Armed.Add(1)
}

// end disarms the guard and ends the capture into pool id.
func (e *poolEnv) end(id core.PoolID) {
	e.t.Helper()
	e.g.Armed.Add(-1)
	require.NoError(e.t, e.a.EndAllocateToPool(id))
}

func (e *poolEnv) alloc(size uint64, s vmm.Stream) vmm.DevicePtr {
	e.t.Helper()
	p, err := e.a.Alloc(size, s)
	require.NoError(e.t, err, "Alloc(%d, %#x)", size, uintptr(s))
	return p
}

func (e *poolEnv) allocIn(id core.PoolID, size uint64, s vmm.Stream) vmm.DevicePtr {
	e.t.Helper()
	p, err := e.a.AllocInPool(id, size, s)
	require.NoError(e.t, err, "AllocInPool(%v, %d)", id, size)
	return p
}

func (e *poolEnv) free(ps ...vmm.DevicePtr) {
	e.t.Helper()
	for _, p := range ps {
		require.NoError(e.t, e.a.Free(p))
	}
}

func (e *poolEnv) forbidden() map[vmmtest.Op]int {
	m := map[vmmtest.Op]int{}
	for _, op := range forbiddenOps {
		m[op] = e.f.Calls(op)
	}
	return m
}

// noViolations checks that the guard saw no forbidden call.
func (e *poolEnv) noViolations() {
	e.t.Helper()
	require.Empty(e.t, e.g.Violations(), "calls illegal during stream capture were made while a pool was active")
}

// segmentOf returns the segment of a's snapshot that holds ptr.
func segmentOf(a interface{ Snapshot() core.Snapshot }, ptr vmm.DevicePtr) (core.Segment, bool) {
	for _, seg := range a.Snapshot().Segments {
		if ptr >= seg.Base && ptr < seg.Base.Add(seg.Reserved) {
			return seg, true
		}
	}
	return core.Segment{}, false
}

// poolOf returns the private pool of the segment that holds ptr.
func (e *poolEnv) poolOf(ptr vmm.DevicePtr) core.PoolID {
	e.t.Helper()
	seg, ok := segmentOf(e.a, ptr)
	require.True(e.t, ok, "%v is in no segment", ptr)
	return seg.PrivatePool
}

func poolSegments(a interface{ Snapshot() core.Snapshot }, id core.PoolID) []core.Segment {
	var out []core.Segment
	for _, seg := range a.Snapshot().Segments {
		if seg.PrivatePool == id {
			out = append(out, seg)
		}
	}
	return out
}

// requireOutside checks that [p, p+size) overlaps no segment of pool id
// (so no block of it, freed or not).
func requireOutside(t *testing.T, a interface{ Snapshot() core.Snapshot }, p vmm.DevicePtr, size uint64, id core.PoolID) {
	t.Helper()
	segs := poolSegments(a, id)
	require.NotEmpty(t, segs, "pool %v has no segment", id)
	for _, seg := range segs {
		if p < seg.Base.Add(seg.Reserved) && seg.Base < p.Add(size) {
			t.Fatalf("block %v+%d overlaps segment %v+%d of pool %v", p, size, seg.Base, seg.Reserved, id)
		}
		for _, b := range seg.Blocks {
			require.False(t, p < b.Ptr.Add(b.Size) && b.Ptr < p.Add(size), "block %v+%d overlaps %v block %v+%d of pool %v", p, size, b.State, b.Ptr, b.Size, id)
		}
	}
}

func mappedOf(a interface{ Snapshot() core.Snapshot }, id core.PoolID) []core.Range {
	var out []core.Range
	for _, seg := range poolSegments(a, id) {
		out = append(out, seg.Mapped...)
	}
	return out
}

func blockState(t *testing.T, a interface{ Snapshot() core.Snapshot }, p vmm.DevicePtr) core.BlockState {
	t.Helper()
	seg, ok := segmentOf(a, p)
	require.True(t, ok)
	for _, b := range seg.Blocks {
		if b.Ptr == p {
			return b.State
		}
	}
	t.Fatalf("no block at %v", p)
	return ""
}

// stamp is the content tag writes at both ends of a block.
func stamp(tag int) []byte {
	b := make([]byte, 64)
	for i := range b {
		b[i] = byte(tag*37 + i*11 + 3)
	}
	return b
}

func tagBlock(t testing.TB, d vmm.Driver, p vmm.DevicePtr, size uint64, tag int) {
	t.Helper()
	n := min(size, 64)
	require.NoError(t, d.CopyHtoD(p, stamp(tag)[:n]))
	require.NoError(t, d.CopyHtoD(p.Add(size-n), stamp(tag)[:n]))
}

func checkTag(t testing.TB, d vmm.Driver, p vmm.DevicePtr, size uint64, tag int) {
	t.Helper()
	n := min(size, 64)
	for _, at := range []vmm.DevicePtr{p, p.Add(size - n)} {
		got := make([]byte, n)
		require.NoError(t, d.CopyDtoH(got, at))
		require.True(t, bytes.Equal(got, stamp(tag)[:n]), "block %v+%d (tag %d) was overwritten", p, size, tag)
	}
}

var poolSizes = []uint64{512, 4096, 1 << 20, 3 << 20, 25 << 20}

// TestPoolCaptureAddressesStayPrivate is the corruption case: a temporary
// freed during capture into pool A keeps its address for A's graph, so a
// later capture into pool B on the same stream, and plain allocations on
// that stream after both, must never be given it (nor any other byte of
// A's or B's segments) while the pools are retained.
func TestPoolCaptureAddressesStayPrivate(t *testing.T) {
	for _, size := range poolSizes {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			e := newPoolEnv(t, 1<<30, ClassicConfig())
			A, B := pid(1), pid(2)
			e.begin(A, onStream(e.s))
			tmp := e.alloc(size, e.s)
			y := e.alloc(size, e.s)
			tagBlock(t, e.host, y, size, 1)
			require.Equal(t, A, e.poolOf(tmp))
			require.Equal(t, A, e.poolOf(y))
			e.free(tmp)
			e.end(A)

			e.begin(B, onStream(e.s))
			w := e.alloc(size, e.s)
			require.NotEqual(t, tmp, w, "capture B was given capture A's freed temporary")
			require.Equal(t, B, e.poolOf(w))
			requireOutside(t, e.a, w, size, A)
			tagBlock(t, e.host, w, size, 2)
			e.end(B)

			// Several, so that any cached block of the stream would show.
			for i := range 4 {
				x := e.alloc(size, e.s)
				require.Equal(t, core.PoolID{}, e.poolOf(x), "a plain allocation after the captures came from a private pool")
				requireOutside(t, e.a, x, size, A)
				requireOutside(t, e.a, x, size, B)
				tagBlock(t, e.host, x, size, 10+i)
			}
			checkTag(t, e.host, y, size, 1)
			checkTag(t, e.host, w, size, 2)

			// The freed temporary is still A's.
			require.Equal(t, tmp, e.allocIn(A, size, e.s))
			e.noViolations()
		})
	}
}

// TestPoolTempFreedInCaptureStaysInPool: within the active pool a freed
// block is reused by a later allocation of the same capture (PyTorch's
// semantics: the graph orders the kernels that use both), but once the
// capture ends, allocations on the capture stream come from the shared
// pools and never get the temporary.
func TestPoolTempFreedInCaptureStaysInPool(t *testing.T) {
	for _, size := range poolSizes {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			e := newPoolEnv(t, 1<<30, ClassicConfig())
			A := pid(7)
			e.begin(A, onStream(e.s))
			tmp := e.alloc(size, e.s)
			out := e.alloc(size, e.s)
			e.free(tmp)
			again := e.alloc(size, e.s)
			require.Equal(t, tmp, again, "a block freed in the active pool is reused by the pool (PyTorch's semantics)")
			e.free(again)
			e.end(A)

			ptrs, err := e.a.PoolAllocations(A)
			require.NoError(t, err)
			require.Equal(t, []vmm.DevicePtr{out}, ptrs)
			for _, s := range []vmm.Stream{e.s, 0, e.side} {
				for range 3 {
					q := e.alloc(size, s)
					require.NotEqual(t, tmp, q)
					require.Equal(t, core.PoolID{}, e.poolOf(q))
					requireOutside(t, e.a, q, size, A)
				}
			}
			e.noViolations()
		})
	}
}

func TestPoolSharedIDAndUseCounting(t *testing.T) {
	e := newPoolEnv(t, 1<<30, ClassicConfig())
	A := pid(3)
	e.begin(A, onStream(e.s))
	tmp := e.alloc(1<<20, e.s)
	e.free(tmp)
	e.end(A)
	// A second graph captured with the same pool id shares the pool.
	e.begin(A, onStream(e.s))
	r := e.alloc(1<<20, e.s)
	require.Equal(t, tmp, r, "the second capture reuses the first one's freed temporary")
	e.end(A)
	e.free(r)

	// Two Begins hold two uses; RetainPool one more.
	require.NoError(t, e.a.RetainPool(A))
	for range 3 {
		e.free(e.allocIn(A, 512, 0)) // still retained
		require.NoError(t, e.a.ReleasePool(A))
	}
	require.ErrorIs(t, e.a.ReleasePool(A), vmm.ErrInvalid, "released more often than retained")
	_, err := e.a.AllocInPool(A, 512, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid, "allocating in a released pool")
	require.Empty(t, poolSegments(e.a, A), "a released pool with nothing allocated is gone")
	_, err = e.a.PoolAllocations(A)
	require.ErrorIs(t, err, vmm.ErrInvalid, "the pool is gone")
	// RetainPool makes it anew.
	require.NoError(t, e.a.RetainPool(A))
	ptrs, err := e.a.PoolAllocations(A)
	require.NoError(t, err)
	require.Empty(t, ptrs)
	require.NoError(t, e.a.ReleasePool(A))
	e.noViolations()
}

func TestPoolBadCalls(t *testing.T) {
	e := newPoolEnv(t, 1<<30, ClassicConfig())
	zero, A, unknown := core.PoolID{}, pid(1), pid(99)
	t.Run("ZeroID", func(t *testing.T) {
		before := e.a.Stats()
		require.ErrorIs(t, e.a.BeginAllocateToPool(zero, onStream(e.s)), vmm.ErrInvalid)
		require.ErrorIs(t, e.a.EndAllocateToPool(zero), vmm.ErrInvalid)
		require.ErrorIs(t, e.a.RetainPool(zero), vmm.ErrInvalid)
		require.ErrorIs(t, e.a.ReleasePool(zero), vmm.ErrInvalid)
		_, err := e.a.AllocInPool(zero, 512, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid, "AllocInPool with the zero id must not fall back to the shared pools")
		_, err = e.a.PoolAllocations(zero)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		_, err = e.a.CheckpointPool(zero)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		_, _, err = e.a.RestorePool(core.PoolCheckpoint{})
		require.ErrorIs(t, err, vmm.ErrInvalid)
		require.Equal(t, before.AllocatedBytes, e.a.Stats().AllocatedBytes)
		// The zero id did not start a capture: EmptyCache works.
		require.NoError(t, e.a.EmptyCache())
	})
	t.Run("Unknown", func(t *testing.T) {
		require.ErrorIs(t, e.a.ReleasePool(unknown), vmm.ErrInvalid)
		require.ErrorIs(t, e.a.EndAllocateToPool(unknown), vmm.ErrInvalid)
		_, err := e.a.AllocInPool(unknown, 512, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		_, err = e.a.PoolAllocations(unknown)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		_, err = e.a.CheckpointPool(unknown)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		_, _, err = e.a.RestorePool(core.PoolCheckpoint{ID: unknown})
		require.ErrorIs(t, err, vmm.ErrInvalid)
	})
	t.Run("EndNotActive", func(t *testing.T) {
		require.NoError(t, e.a.RetainPool(A))
		require.ErrorIs(t, e.a.EndAllocateToPool(A), vmm.ErrInvalid, "retained but not active")
		e.begin(A, onStream(e.s))
		e.end(A)
		require.ErrorIs(t, e.a.EndAllocateToPool(A), vmm.ErrInvalid, "ended twice")
		require.NoError(t, e.a.ReleasePool(A))
		require.NoError(t, e.a.ReleasePool(A))
		require.ErrorIs(t, e.a.ReleasePool(A), vmm.ErrInvalid)
	})
	t.Run("Size", func(t *testing.T) {
		require.NoError(t, e.a.RetainPool(A))
		_, err := e.a.AllocInPool(A, 0, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		_, err = e.a.AllocInPool(A, 2<<30, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		require.NoError(t, e.a.ReleasePool(A))
	})
	t.Run("Closed", func(t *testing.T) {
		require.NoError(t, e.a.RetainPool(A))
		_, err := e.a.AllocInPool(A, 512, 0)
		require.NoError(t, err)
		require.NoError(t, e.a.Close())
		require.ErrorIs(t, e.a.BeginAllocateToPool(A, nil), vmm.ErrClosed)
		require.ErrorIs(t, e.a.EndAllocateToPool(A), vmm.ErrClosed)
		require.ErrorIs(t, e.a.RetainPool(A), vmm.ErrClosed)
		require.ErrorIs(t, e.a.ReleasePool(A), vmm.ErrClosed)
		_, err = e.a.AllocInPool(A, 512, 0)
		require.ErrorIs(t, err, vmm.ErrClosed)
		_, err = e.a.PoolAllocations(A)
		require.ErrorIs(t, err, vmm.ErrClosed)
		_, err = e.a.CheckpointPool(A)
		require.ErrorIs(t, err, vmm.ErrClosed)
		_, _, err = e.a.RestorePool(core.PoolCheckpoint{ID: A})
		require.ErrorIs(t, err, vmm.ErrClosed)
	})
	e.noViolations()
}

func TestPoolRouting(t *testing.T) {
	e := newPoolEnv(t, 1<<30, ClassicConfig())
	A, B := pid(1), pid(2)

	// A nil filter routes nothing; AllocInPool still reaches the pool.
	e.begin(A, nil)
	p := e.alloc(4096, e.s)
	require.Equal(t, core.PoolID{}, e.poolOf(p))
	q := e.allocIn(A, 4096, e.s)
	require.Equal(t, A, e.poolOf(q))
	e.end(A)

	// The filter picks the stream; the first pool begun whose filter
	// accepts wins.
	e.begin(A, onStream(e.s))
	e.begin(B, func(vmm.Stream) bool { return true })
	r := e.alloc(4096, e.s)
	require.Equal(t, A, e.poolOf(r))
	o := e.alloc(4096, 0)
	require.Equal(t, B, e.poolOf(o))
	e.end(A)
	r2 := e.alloc(4096, e.s)
	require.Equal(t, B, e.poolOf(r2), "with A ended, B's filter accepts")
	e.end(B)
	x := e.alloc(4096, e.s)
	require.Equal(t, core.PoolID{}, e.poolOf(x))

	// Nested begins of one pool: the pool stays active until the last end.
	e.begin(A, onStream(e.s))
	e.begin(A, onStream(e.s))
	e.end(A)
	require.Equal(t, A, e.poolOf(e.alloc(4096, e.s)))
	e.end(A)
	require.Equal(t, core.PoolID{}, e.poolOf(e.alloc(4096, e.s)))
	e.noViolations()
}

// TestPoolReleaseReturnsMemory: the last ReleasePool of a pool with nothing
// allocated gives all its memory back; a live block keeps its pages until
// it is freed.
func TestPoolReleaseReturnsMemory(t *testing.T) {
	type setup struct {
		e     *poolEnv
		base  int64
		baseU vmm.Usage
	}
	start := func(t *testing.T) setup {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		keep := e.alloc(3<<20, 0) // the shared pools hold something too
		_ = keep
		require.NoError(t, e.a.EmptyCache())
		return setup{e, e.a.Stats().ReservedBytes.All.Current, e.host.Usage()}
	}
	sameUsage := func(t *testing.T, want, got vmm.Usage) {
		t.Helper()
		require.Equal(t, want.Handles, got.Handles, "pages")
		require.Equal(t, want.Mappings, got.Mappings, "mappings")
		require.Equal(t, want.MappedBytes, got.MappedBytes, "mapped bytes")
		require.Equal(t, want.Ranges, got.Ranges, "reserved ranges")
	}

	t.Run("Empty", func(t *testing.T) {
		c := start(t)
		e, A := c.e, pid(1)
		e.begin(A, onStream(e.s))
		var ps []vmm.DevicePtr
		for _, size := range []uint64{512, 1 << 20, 3 << 20, 45 << 20} {
			ps = append(ps, e.alloc(size, e.s))
		}
		e.end(A)
		e.free(ps...)
		held := e.a.Stats().ReservedBytes.All.Current
		require.Greater(t, held, c.base)
		require.NoError(t, e.a.EmptyCache())
		require.Equal(t, held, e.a.Stats().ReservedBytes.All.Current, "EmptyCache keeps a retained pool's pages")
		syncs := e.f.Calls(vmmtest.OpDeviceSynchronize)
		require.NoError(t, e.a.ReleasePool(A))
		require.Equal(t, syncs+1, e.f.Calls(vmmtest.OpDeviceSynchronize), "the device is synchronized before the pool's pages go")
		require.Equal(t, c.base, e.a.Stats().ReservedBytes.All.Current)
		require.Empty(t, poolSegments(e.a, A))
		sameUsage(t, c.baseU, e.host.Usage())
		require.NoError(t, e.a.EmptyCache())
		require.Equal(t, c.base, e.a.Stats().ReservedBytes.All.Current)
	})

	t.Run("LiveBlock", func(t *testing.T) {
		c := start(t)
		e, A := c.e, pid(1)
		e.begin(A, onStream(e.s))
		live := e.alloc(3<<20, e.s)
		tmp := e.alloc(50<<20, e.s)
		small := e.alloc(4096, e.s)
		e.free(tmp, small)
		e.end(A)
		tagBlock(t, e.host, live, 3<<20, 5)
		held := e.a.Stats().ReservedBytes.All.Current
		require.NoError(t, e.a.ReleasePool(A))
		after := e.a.Stats().ReservedBytes.All.Current
		require.Less(t, after, held, "the free pages go at once")
		require.Greater(t, after, c.base, "the live block's page stays")
		ptrs, err := e.a.PoolAllocations(A)
		require.NoError(t, err)
		require.Equal(t, []vmm.DevicePtr{live}, ptrs)
		_, err = e.a.AllocInPool(A, 512, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		require.NoError(t, e.a.EmptyCache())
		checkTag(t, e.host, live, 3<<20, 5)
		require.Equal(t, A, e.poolOf(live))
		e.free(live)
		require.Equal(t, c.base, e.a.Stats().ReservedBytes.All.Current, "the last block freed takes the pool with it")
		require.Empty(t, poolSegments(e.a, A))
		sameUsage(t, c.baseU, e.host.Usage())
	})

	// A live block used on another stream: its free waits for the stream
	// (events held incomplete); the pool still goes at that free, after
	// the device-wide sync.
	t.Run("LiveBlockUsedOnAnotherStream", func(t *testing.T) {
		c := start(t)
		e, A := c.e, pid(1)
		require.NoError(t, e.a.RetainPool(A))
		live := e.allocIn(A, 1<<20, e.s)
		require.NoError(t, e.a.RecordStream(live, e.side))
		require.NoError(t, e.a.ReleasePool(A))
		e.g.Hold.Store(true)
		e.free(live)
		require.Empty(t, poolSegments(e.a, A), "the released pool's last block went after a device sync")
		require.Equal(t, c.base, e.a.Stats().ReservedBytes.All.Current)
		sameUsage(t, c.baseU, e.host.Usage())
	})

	// A released pool kept alive by a live block can be retained again:
	// it maps pages anew, and they are in use again.
	t.Run("RetainAgain", func(t *testing.T) {
		c := start(t)
		e, A := c.e, pid(1)
		require.NoError(t, e.a.RetainPool(A))
		live := e.allocIn(A, 3<<20, 0)
		e.free(e.allocIn(A, 50<<20, 0))
		require.NoError(t, e.a.ReleasePool(A))
		require.NoError(t, e.a.RetainPool(A))
		p := e.allocIn(A, 50<<20, 0)
		require.Equal(t, A, e.poolOf(p))
		e.free(p)
		m := mappedOf(e.a, A)
		require.NoError(t, e.a.EmptyCache())
		require.Equal(t, m, mappedOf(e.a, A), "retained again: its pages stay")
		require.NoError(t, e.a.ReleasePool(A))
		e.free(live)
		require.Empty(t, poolSegments(e.a, A))
		sameUsage(t, c.baseU, e.host.Usage())
	})

	// Releasing while another pool is active waits for its end.
	t.Run("ReleaseDuringCapture", func(t *testing.T) {
		c := start(t)
		e, A, B := c.e, pid(1), pid(2)
		require.NoError(t, e.a.RetainPool(A))
		e.free(e.allocIn(A, 30<<20, 0))
		mapped := mappedOf(e.a, A)
		require.NotEmpty(t, mapped)
		e.begin(B, onStream(e.s))
		require.NoError(t, e.a.ReleasePool(A))
		require.Equal(t, mapped, mappedOf(e.a, A), "nothing is unmapped while a pool is active")
		e.free(e.alloc(4096, e.s))
		e.noViolations()
		e.end(B)
		require.Empty(t, poolSegments(e.a, A), "the release is done once no pool is active")
		require.NoError(t, e.a.ReleasePool(B))
		require.Equal(t, c.base, e.a.Stats().ReservedBytes.All.Current)
		sameUsage(t, c.baseU, e.host.Usage())
	})

	// Exact-size lists hold two halves of one page: together they are a
	// whole free page, which must not be unmapped before the device sync.
	t.Run("SyncBeforeUnmappingCoalescedPage", func(t *testing.T) {
		c := start(t)
		e, A := c.e, pid(1)
		require.NoError(t, e.a.RetainPool(A))
		p := e.allocIn(A, 1<<20, 0)
		q := e.allocIn(A, 1<<20, 0)
		e.free(p, q)
		unmaps, syncs := e.f.Calls(vmmtest.OpUnmap), e.f.Calls(vmmtest.OpDeviceSynchronize)
		require.NoError(t, e.a.ReleasePool(A))
		require.Greater(t, e.f.Calls(vmmtest.OpUnmap), unmaps)
		require.Equal(t, syncs+1, e.f.Calls(vmmtest.OpDeviceSynchronize), "a page was unmapped without waiting for the device")
		require.Empty(t, poolSegments(e.a, A))
		sameUsage(t, c.baseU, e.host.Usage())
	})
}

// TestPoolNoSyncWhileActive: while a pool is active the allocator makes no
// call that stream capture forbids, whatever it is asked.
func TestPoolNoSyncWhileActive(t *testing.T) {
	cfg := ClassicConfig()
	cfg.ReleaseThreshold = 4 << 20
	e := newPoolEnv(t, 1<<30, cfg)
	A, B := pid(1), pid(2)

	// Before: a pending shared free (an event recorded, not completed), a
	// shared block used on the side stream, and a retained pool B with free
	// pages.
	e.g.Hold.Store(true)
	pend := e.alloc(2<<20, 0)
	require.NoError(t, e.a.RecordStream(pend, e.side))
	e.free(pend)
	require.Equal(t, core.BlockPending, blockState(t, e.a, pend))
	sh := e.alloc(1<<20, 0)
	require.NoError(t, e.a.RecordStream(sh, e.side))
	require.NoError(t, e.a.RetainPool(B))
	e.free(e.allocIn(B, 45<<20, 0))
	cpB, err := e.a.CheckpointPool(B)
	require.NoError(t, err)
	mappedB := mappedOf(e.a, B)

	before := e.forbidden()
	e.begin(A, onStream(e.s))
	x := e.alloc(1<<20, e.s)
	y := e.alloc(512, e.s)
	big := e.alloc(50<<20, e.s) // growth: new pages mapped during capture
	require.Equal(t, A, e.poolOf(big))
	require.NoError(t, e.a.RecordStream(x, e.side))
	e.free(x)
	require.Equal(t, core.BlockPending, blockState(t, e.a, x), "a free of a block used on another stream is deferred")
	x2 := e.alloc(1<<20, e.s)
	require.NotEqual(t, x, x2, "a deferred block is not reused during the capture")
	e.free(sh) // a shared block used on the side stream: deferred too
	sp := e.alloc(2<<20, 0)
	require.NotEqual(t, pend, sp, "pending events are not polled during capture")
	sg := e.alloc(90<<20, 0) // shared growth
	e.free(sg, sp, big, y)   // frees above the release threshold: no trim
	require.ErrorIs(t, e.a.EmptyCache(), vmm.ErrInUse)
	_, _, err = e.a.RestorePool(cpB)
	require.ErrorIs(t, err, vmm.ErrInUse)
	_, err = e.a.CheckpointPool(A)
	require.NoError(t, err, "checkpointing needs no driver call")
	require.NoError(t, e.a.ReleasePool(B))
	require.Equal(t, mappedB, mappedOf(e.a, B), "a pool released during capture keeps its pages until the end")
	e.noViolations()
	require.Equal(t, before, e.forbidden())

	recorded := e.f.Calls(vmmtest.OpEventRecord)
	e.end(A)
	require.Equal(t, recorded+2, e.f.Calls(vmmtest.OpEventRecord), "the deferred frees record their events at the end")
	require.Empty(t, poolSegments(e.a, B), "B is given back at the end")
	// The event of x has not completed: x stays out of reach.
	z := e.allocIn(A, 1<<20, e.s)
	require.NotEqual(t, x, z)
	e.g.Hold.Store(false)
	require.Equal(t, x, e.allocIn(A, 1<<20, e.s), "once its event completed, x is reused in its pool")
	require.Equal(t, pend, e.alloc(2<<20, 0))
	e.free(x2, z)
	require.NoError(t, e.a.ReleasePool(A))
}

// TestPoolOOMDuringCapture: an allocation that finds no memory during
// capture fails at once, without emptying the cache, waiting or retrying.
func TestPoolOOMDuringCapture(t *testing.T) {
	cfg := ClassicConfig()
	cfg.OOMWait = 2 * time.Second
	cfg.OOMMaxRetries = 3
	cfg.OOMDelay = 200 * time.Millisecond
	e := newPoolEnv(t, 100<<20, cfg) // five 20 MiB pages
	A := pid(1)
	e.free(e.alloc(60<<20, 0)) // three pages mapped, free, in the shared pools
	shared := e.a.Stats().ReservedBytes.All.Current
	before := e.forbidden()
	e.begin(A, onStream(e.s))
	startT := time.Now()
	_, err := e.a.Alloc(60<<20, e.s)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.Less(t, time.Since(startT), time.Second, "no OOM wait or retry during capture")
	_, err = e.a.AllocInPool(A, 60<<20, e.s)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.Equal(t, shared, e.a.Stats().ReservedBytes.All.Current, "the shared cache was not emptied")
	q0, n, err := e.a.AllocAtMost(4<<30, 1<<20, e.s) // shrinks to what fits, no cache emptied
	require.NoError(t, err)
	require.LessOrEqual(t, n, uint64(40<<20))
	require.Equal(t, A, e.poolOf(q0))
	e.free(q0)
	p := e.alloc(30<<20, e.s) // what fits still works
	require.Equal(t, A, e.poolOf(p))
	e.noViolations()
	require.Equal(t, before, e.forbidden())
	require.Equal(t, int64(2), e.a.Stats().NumOOMs)
	e.end(A)
	// After the capture the OOM policy may empty the shared cache.
	q := e.allocIn(A, 40<<20, e.s)
	require.Equal(t, A, e.poolOf(q))
	e.free(p, q)
	require.NoError(t, e.a.ReleasePool(A))
	require.NoError(t, e.a.EmptyCache())
	require.Zero(t, e.a.Stats().ReservedBytes.All.Current)
}

// TestPoolPagesNeverUnmapped: the free pages of a retained pool stay
// mapped whatever gives memory back: EmptyCache, the release threshold,
// the OOM policy, page stealing.
func TestPoolPagesNeverUnmapped(t *testing.T) {
	fill := func(e *poolEnv, id core.PoolID) []core.Range {
		e.begin(id, onStream(e.s))
		var ps []vmm.DevicePtr
		for _, size := range []uint64{512, 1 << 20, 3 << 20, 41 << 20} {
			ps = append(ps, e.alloc(size, e.s))
		}
		e.end(id)
		e.free(ps...)
		m := mappedOf(e.a, id)
		require.NotEmpty(e.t, m)
		return m
	}
	t.Run("EmptyCache", func(t *testing.T) {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		A := pid(1)
		m := fill(e, A)
		require.NoError(t, e.a.EmptyCache())
		require.Equal(t, m, mappedOf(e.a, A))
		require.NoError(t, e.a.ReleasePool(A))
		require.NoError(t, e.a.EmptyCache())
		require.Zero(t, e.a.Stats().ReservedBytes.All.Current)
	})
	t.Run("ReleaseThreshold", func(t *testing.T) {
		cfg := ClassicConfig()
		cfg.ReleaseThreshold = 1 // unmap every free page at once
		e := newPoolEnv(t, 1<<30, cfg)
		A := pid(1)
		m := fill(e, A)
		require.Equal(t, m, mappedOf(e.a, A), "the frees in the pool trimmed nothing of it")
		unmaps := e.a.Stats().Unmaps
		e.free(e.alloc(45<<20, 0), e.alloc(4096, e.s))
		require.Greater(t, e.a.Stats().Unmaps, unmaps, "the shared pages were trimmed")
		require.Equal(t, m, mappedOf(e.a, A))
		require.NoError(t, e.a.ReleasePool(A))
		require.Empty(t, poolSegments(e.a, A))
	})
	t.Run("OOM", func(t *testing.T) {
		cfg := ClassicConfig()
		cfg.OOMMaxRetries = 1
		cfg.OOMDelay = time.Millisecond
		e := newPoolEnv(t, 120<<20, cfg)
		A := pid(1)
		m := fill(e, A) // 60 MiB of large pages, 2 MiB of small ones
		_, err := e.a.Alloc(60<<20, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory, "only the pool's free pages could serve it")
		require.Positive(t, e.a.Stats().NumAllocRetries, "the OOM policy ran")
		require.Equal(t, m, mappedOf(e.a, A))
		_, err = e.a.Alloc(60<<20, e.side)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		require.Equal(t, m, mappedOf(e.a, A))
		require.NoError(t, e.a.ReleasePool(A))
		p := e.alloc(60<<20, 0)
		e.free(p)
	})
	t.Run("Stealing", func(t *testing.T) {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		A := pid(1)
		m := fill(e, A)
		// Shared growth with whole free pages in the middle of the shared
		// segment: they are stolen (unmapped for reuse), never A's.
		p := e.alloc(40<<20, 0)
		q := e.alloc(10<<20, 0)
		e.free(p)
		unmaps := e.a.Stats().Unmaps
		r := e.alloc(50<<20, 0)
		require.Greater(t, e.a.Stats().Unmaps, unmaps, "shared pages were stolen")
		require.Equal(t, m, mappedOf(e.a, A))
		e.free(q, r)
		require.NoError(t, e.a.ReleasePool(A))
	})
}

func TestPoolCheckpointRestore(t *testing.T) {
	e := newPoolEnv(t, 1<<30, ClassicConfig())
	A := pid(4)
	e.begin(A, onStream(e.s))
	sizes := []uint64{3 << 20, 5 << 20, 2 << 20, 7 << 20, 2 << 20, 4096}
	var bs []vmm.DevicePtr
	for _, size := range sizes {
		bs = append(bs, e.alloc(size, e.s))
	}
	e.end(A)
	cp, err := e.a.CheckpointPool(A)
	require.NoError(t, err)
	require.Len(t, cp.Blocks, len(bs))
	want := slices.Sorted(slices.Values(bs))
	for i, b := range cp.Blocks {
		require.Equal(t, want[i], b.Ptr, "checkpoint blocks in address order")
	}
	// The checkpoint survives JSON, as libxseg hands it to Python.
	js, err := json.Marshal(cp)
	require.NoError(t, err)
	require.Contains(t, string(js), `"id":[0,4]`)
	var cp2 core.PoolCheckpoint
	require.NoError(t, json.Unmarshal(js, &cp2))
	require.Equal(t, cp, cp2)

	statsAt := e.a.Stats()
	// Free bs[1] and bs[3]; allocate c1 (larger than both: it lands
	// elsewhere), c2 of bs[3]'s size (it takes bs[3]'s place: kept as
	// bs[3]), c3 on another stream.
	e.free(bs[1], bs[3])
	c1 := e.allocIn(A, 8<<20, e.s)
	require.NotContains(t, bs, c1)
	c2 := e.allocIn(A, sizes[3], e.s)
	require.Equal(t, bs[3], c2)
	c3 := e.allocIn(A, 1<<20, e.side)
	// bs[2] is freed with a stream use: pending when the restore comes.
	require.NoError(t, e.a.RecordStream(bs[2], e.side))
	e.g.Hold.Store(true)
	e.free(bs[2])
	require.Equal(t, core.BlockPending, blockState(t, e.a, bs[2]))

	freed, allocated, err := e.a.RestorePool(cp2)
	require.NoError(t, err)
	require.ElementsMatch(t, []vmm.DevicePtr{c1, c3}, freed)
	require.ElementsMatch(t, []vmm.DevicePtr{bs[1], bs[2]}, allocated)
	ptrs, err := e.a.PoolAllocations(A)
	require.NoError(t, err)
	require.Equal(t, want, ptrs)
	cpAfter, err := e.a.CheckpointPool(A)
	require.NoError(t, err)
	require.Equal(t, cp, cpAfter)
	st := e.a.Stats()
	require.Equal(t, statsAt.AllocatedBytes.All.Current, st.AllocatedBytes.All.Current)
	require.Equal(t, statsAt.Allocations.All.Current, st.Allocations.All.Current)
	require.Equal(t, statsAt.RequestedBytes.All.Current, st.RequestedBytes.All.Current)

	// Restoring again changes nothing.
	freed, allocated, err = e.a.RestorePool(cp)
	require.NoError(t, err)
	require.Empty(t, freed)
	require.Empty(t, allocated)

	// A block allocated over a checkpointed one's place (bs[0] and bs[1]
	// coalesced) is freed and the checkpointed blocks carved back.
	e.free(bs[0], bs[1])
	over := e.allocIn(A, sizes[0]+sizes[1], e.s)
	require.Equal(t, bs[0], over, "the coalesced place of bs[0] and bs[1]")
	freed, allocated, err = e.a.RestorePool(cp)
	require.NoError(t, err)
	require.Equal(t, []vmm.DevicePtr{over}, freed)
	require.ElementsMatch(t, []vmm.DevicePtr{bs[0], bs[1]}, allocated)
	ptrs, err = e.a.PoolAllocations(A)
	require.NoError(t, err)
	require.Equal(t, want, ptrs)

	// The restored blocks are ordinary blocks of the pool.
	e.free(bs[1])
	require.Equal(t, bs[1], e.allocIn(A, sizes[1], e.s))

	// While a pool is active: ErrInUse.
	B := pid(5)
	e.begin(B, onStream(e.s))
	_, _, err = e.a.RestorePool(cp)
	require.ErrorIs(t, err, vmm.ErrInUse)
	e.end(B)
	require.NoError(t, e.a.ReleasePool(B))

	// A checkpoint naming memory outside the pool is refused.
	sh := e.alloc(sizes[0], 0)
	bad := core.PoolCheckpoint{ID: A, Blocks: append(slices.Clone(cp.Blocks), core.CheckpointBlock{Ptr: sh, Size: sizes[0], Requested: sizes[0]})}
	_, _, err = e.a.RestorePool(bad)
	require.ErrorIs(t, err, vmm.ErrInvalid, "a shared block is not the pool's")
	bad = core.PoolCheckpoint{ID: A, Blocks: []core.CheckpointBlock{{Ptr: 0x1000, Size: 512, Requested: 512}}}
	freed, _, err = e.a.RestorePool(bad)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ElementsMatch(t, want, freed, "as documented, the frees are done before the failing block")
	e.free(sh)
	_, _, err = e.a.RestorePool(cp)
	require.NoError(t, err)

	// Malformed blocks (as a checkpoint read back from JSON may hold) are
	// refused without changing the pool: a block of 0 bytes, of a size
	// that is not whole 512-byte units, misaligned, or wrapping around.
	e.free(bs[4])
	at := bs[4].Add(512)
	for _, cb := range []core.CheckpointBlock{{Ptr: at, Size: 0}, {Ptr: at, Size: 700}, {Ptr: at + 256, Size: 512}, {Ptr: at, Size: ^uint64(0) - 511}} {
		bad = core.PoolCheckpoint{ID: A, Blocks: []core.CheckpointBlock{cb}}
		before, err := e.a.PoolAllocations(A)
		require.NoError(t, err)
		_, _, err = e.a.RestorePool(bad)
		require.ErrorIs(t, err, vmm.ErrInvalid, "checkpoint block %v+%d", cb.Ptr, cb.Size)
		for _, seg := range poolSegments(e.a, A) {
			for _, b := range seg.Blocks {
				require.True(t, b.Size > 0 && b.Size%512 == 0 && uint64(b.Ptr-seg.Base)%512 == 0, "restoring %v+%d made block %v+%d", cb.Ptr, cb.Size, b.Ptr, b.Size)
			}
		}
		if cb.Size == 0 || cb.Size%512 != 0 || cb.Ptr.Add(cb.Size) < cb.Ptr {
			after, err := e.a.PoolAllocations(A)
			require.NoError(t, err)
			require.Equal(t, before, after, "refused before changing anything")
		}
	}
	_, _, err = e.a.RestorePool(cp)
	require.NoError(t, err)

	// A released pool cannot be restored.
	require.NoError(t, e.a.ReleasePool(A))
	_, _, err = e.a.RestorePool(cp)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	e.noViolations()
}

// TestPoolGiveBackFaults: a failing sync, unmap or page release while a
// released pool gives its memory back is reported (returned or logged),
// leaves the books consistent, and a later EmptyCache gives it all back.
func TestPoolGiveBackFaults(t *testing.T) {
	// consistent checks that the reserved bytes are the mapped bytes of
	// the snapshot plus the cached pages, and that the driver agrees.
	consistent := func(e *poolEnv) {
		e.t.Helper()
		snap := e.a.Snapshot()
		var mapped uint64
		for _, seg := range snap.Segments {
			for _, r := range seg.Mapped {
				mapped += r.Size
			}
		}
		require.Equal(e.t, e.host.Usage().MappedBytes, mapped, "the driver's mappings and the snapshot's")
		require.GreaterOrEqual(e.t, uint64(snap.Stats.ReservedBytes.All.Current), mapped)
		require.Equal(e.t, int64(e.host.Usage().HandleBytes), snap.Stats.ReservedBytes.All.Current, "every page held is reserved")
	}
	released := func(e *poolEnv, id core.PoolID) {
		e.t.Helper()
		require.NoError(e.t, e.a.RetainPool(id))
		var ps []vmm.DevicePtr
		for _, size := range []uint64{512, 1 << 20, 30 << 20, 25 << 20} {
			ps = append(ps, e.allocIn(id, size, 0))
		}
		e.free(ps...)
	}
	gone := func(e *poolEnv, id core.PoolID) {
		e.t.Helper()
		require.NoError(e.t, e.a.EmptyCache())
		require.Empty(e.t, poolSegments(e.a, id))
		require.Zero(e.t, e.a.Stats().ReservedBytes.All.Current)
		u := e.host.Usage()
		require.Zero(e.t, u.Handles)
		require.Zero(e.t, u.Ranges)
		consistent(e)
	}
	A := pid(1)

	t.Run("DeviceSynchronize", func(t *testing.T) {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		released(e, A)
		m := mappedOf(e.a, A)
		unmaps := e.f.Calls(vmmtest.OpUnmap)
		e.f.FailNth(vmmtest.OpDeviceSynchronize, 1, nil)
		err := e.a.ReleasePool(A)
		require.ErrorIs(t, err, vmmtest.ErrInjected)
		require.Equal(t, unmaps, e.f.Calls(vmmtest.OpUnmap), "nothing is unmapped without the sync")
		require.Equal(t, m, mappedOf(e.a, A))
		consistent(e)
		// The use was dropped all the same: the pool is released.
		require.ErrorIs(t, e.a.ReleasePool(A), vmm.ErrInvalid)
		_, err = e.a.AllocInPool(A, 512, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		gone(e, A)
	})
	t.Run("Unmap", func(t *testing.T) {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		released(e, A)
		e.f.FailNth(vmmtest.OpUnmap, 2, nil)
		err := e.a.ReleasePool(A)
		require.ErrorIs(t, err, vmmtest.ErrInjected)
		require.NotEmpty(t, poolSegments(e.a, A))
		consistent(e)
		gone(e, A)
	})
	t.Run("Release", func(t *testing.T) {
		cfg := ClassicConfig()
		cfg.PageCacheBytes = 0
		e := newPoolEnv(t, 1<<30, cfg)
		released(e, A)
		for n := 1; n <= 10; n++ {
			e.f.FailNth(vmmtest.OpRelease, n, nil)
		}
		err := e.a.ReleasePool(A)
		require.ErrorIs(t, err, vmmtest.ErrInjected)
		consistent(e)
		require.Positive(t, e.a.Stats().ReservedBytes.All.Current, "the pages that failed to go stay, counted")
		e.f.Reset()
		gone(e, A)
	})
	t.Run("Unreserve", func(t *testing.T) {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		released(e, A)
		e.f.FailNth(vmmtest.OpUnreserve, 1, nil)
		err := e.a.ReleasePool(A)
		require.ErrorIs(t, err, vmmtest.ErrInjected)
		require.NotEmpty(t, poolSegments(e.a, A))
		consistent(e)
		gone(e, A)
	})
	t.Run("AtEnd", func(t *testing.T) {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		released(e, A)
		B := pid(2)
		e.begin(B, onStream(e.s))
		require.NoError(t, e.a.ReleasePool(A))
		e.f.FailNth(vmmtest.OpDeviceSynchronize, 1, nil)
		e.end(B) // no error: the give-back of another pool is logged
		require.True(t, e.log.Contains("giving a released pool's memory back"), "the failure is logged")
		require.NotEmpty(t, poolSegments(e.a, A))
		consistent(e)
		require.NoError(t, e.a.ReleasePool(B))
		gone(e, A)
	})
	t.Run("AtLastFree", func(t *testing.T) {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		require.NoError(t, e.a.RetainPool(A))
		p := e.allocIn(A, 30<<20, 0)
		q := e.allocIn(A, 45<<20, 0)
		e.free(q)
		require.NoError(t, e.a.ReleasePool(A))
		e.f.FailNth(vmmtest.OpUnmap, 1, nil)
		require.NoError(t, e.a.Free(p), "the block is freed; the give-back failure is logged")
		require.True(t, e.log.Contains("giving a released pool's memory back"))
		require.Equal(t, core.BlockFree, blockState(t, e.a, p))
		consistent(e)
		gone(e, A)
	})
	t.Run("EventRecordAtEnd", func(t *testing.T) {
		e := newPoolEnv(t, 1<<30, ClassicConfig())
		B := pid(2)
		e.begin(B, onStream(e.s))
		x := e.alloc(1<<20, e.s)
		require.NoError(t, e.a.RecordStream(x, e.side))
		e.free(x)
		e.f.FailNth(vmmtest.OpEventRecord, 1, nil)
		e.end(B)
		require.True(t, e.log.Contains("recording the events of a free deferred"))
		require.Equal(t, core.BlockPending, blockState(t, e.a, x), "a deferred free whose event failed stays deferred")
		require.NotEqual(t, x, e.allocIn(B, 1<<20, e.s))
		// The next allocation outside any capture retries it.
		e.free(e.alloc(512, 0))
		require.Equal(t, x, e.allocIn(B, 1<<20, e.s))
		require.NoError(t, e.a.ReleasePool(B))
	})
}

// TestPoolConcurrent: goroutines allocate and free in the shared pools
// while another runs capture cycles; nobody's block is overwritten, no
// forbidden call is made while a pool is active, and nothing leaks.
func TestPoolConcurrent(t *testing.T) {
	e := newPoolEnv(t, 4<<30, ClassicConfig())
	const workers = 6
	iters := 300
	cycles := 40
	if testing.Short() {
		iters, cycles = 100, 10
	}
	sizes := []uint64{512, 3000, 64 << 10, 1 << 20, 3 << 20, 21 << 20}
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	check := func(p vmm.DevicePtr, size uint64, tag int) error {
		n := min(size, 64)
		got := make([]byte, n)
		if err := e.host.CopyDtoH(got, p); err != nil {
			return err
		}
		if !bytes.Equal(got, stamp(tag)[:n]) {
			return fmt.Errorf("block %v+%d (tag %d) was overwritten", p, size, tag)
		}
		return nil
	}
	type blk struct {
		p    vmm.DevicePtr
		size uint64
		tag  int
	}
	var overlapped atomic.Int64 // worker allocations while a pool was active
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 11))
			streams := []vmm.Stream{0, e.side}
			var mine []blk
			for i := range iters {
				if len(mine) > 0 && r.IntN(3) == 0 {
					k := r.IntN(len(mine))
					b := mine[k]
					if err := check(b.p, b.size, b.tag); err != nil {
						fail(err)
						return
					}
					if r.IntN(4) == 0 {
						if err := e.a.RecordStream(b.p, streams[r.IntN(2)]); err != nil {
							fail(err)
							return
						}
					}
					if err := e.a.Free(b.p); err != nil {
						fail(err)
						return
					}
					mine = slices.Delete(mine, k, k+1)
					continue
				}
				if r.IntN(50) == 0 {
					if err := e.a.EmptyCache(); err != nil && !errors.Is(err, vmm.ErrInUse) {
						fail(err)
						return
					}
				}
				size := sizes[r.IntN(len(sizes))]
				if e.g.Armed.Load() > 0 {
					overlapped.Add(1)
				}
				p, err := e.a.Alloc(size, streams[r.IntN(2)])
				if err != nil {
					fail(err)
					return
				}
				tag := w*100000 + i
				if err := e.host.CopyHtoD(p, stamp(tag)[:min(size, 64)]); err != nil {
					fail(err)
					return
				}
				mine = append(mine, blk{p, size, tag})
			}
			for _, b := range mine {
				if err := check(b.p, b.size, b.tag); err != nil {
					fail(err)
					return
				}
				if err := e.a.Free(b.p); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		r := rand.New(rand.NewPCG(99, 1))
		for c := range cycles {
			id := pid(uint64(c%3 + 1))
			captures := 1 + r.IntN(2) // two captures may share the pool
			var live []blk
			for k := range captures {
				if err := e.a.BeginAllocateToPool(id, onStream(e.s)); err != nil {
					fail(err)
					return
				}
				e.g.Armed.Add(1)
				var temps []vmm.DevicePtr
				for j := range 6 {
					size := sizes[r.IntN(len(sizes))]
					p, err := e.a.Alloc(size, e.s)
					if err != nil {
						fail(err)
						return
					}
					tag := 1_000_000 + c*100 + k*10 + j
					if err := e.host.CopyHtoD(p, stamp(tag)[:min(size, 64)]); err != nil {
						fail(err)
						return
					}
					if j%2 == 0 {
						temps = append(temps, p)
					} else {
						live = append(live, blk{p, size, tag})
					}
				}
				for _, p := range temps {
					if err := e.a.Free(p); err != nil {
						fail(err)
						return
					}
				}
				e.g.Armed.Add(-1)
				if err := e.a.EndAllocateToPool(id); err != nil {
					fail(err)
					return
				}
			}
			ptrs, err := e.a.PoolAllocations(id)
			if err != nil {
				fail(err)
				return
			}
			for _, b := range live {
				if !slices.Contains(ptrs, b.p) {
					fail(fmt.Errorf("cycle %d: block %v is not listed in pool %v", c, b.p, id))
					return
				}
			}
			if c%4 == 0 {
				cp, err := e.a.CheckpointPool(id)
				if err != nil {
					fail(err)
					return
				}
				if _, _, err := e.a.RestorePool(cp); err != nil {
					fail(err)
					return
				}
			}
			for _, b := range live {
				if err := check(b.p, b.size, b.tag); err != nil {
					fail(fmt.Errorf("cycle %d: %w", c, err))
					return
				}
				if err := e.a.Free(b.p); err != nil {
					fail(err)
					return
				}
			}
			for range captures {
				if err := e.a.ReleasePool(id); err != nil {
					fail(err)
					return
				}
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d worker allocations while a pool was active", overlapped.Load())
	e.noViolations()
	require.NoError(t, e.a.EmptyCache())
	st := e.a.Stats()
	require.Zero(t, st.AllocatedBytes.All.Current)
	require.Zero(t, st.ActiveBytes.All.Current)
	require.Zero(t, st.ReservedBytes.All.Current)
	for _, seg := range e.a.Snapshot().Segments {
		require.True(t, seg.PrivatePool.IsZero(), "pool %v left a segment", seg.PrivatePool)
	}
	u := e.host.Usage()
	require.Zero(t, u.Handles)
	require.Zero(t, u.Mappings)
	require.Zero(t, u.Ranges)
}

// Regression tests of three bugs the pool tests found (a nil dereference
// in Free after coalescing, OOM retries racing a capture, the release
// threshold counting pool bytes).

// TestRegressionFreeAfterCoalesce: Free reads b.seg after deactivateLocked,
// which may have coalesced b into its free predecessor and recycled it
// (once a state holds maxExact blocks in its exact-size lists): a nil
// dereference at internal/core/heap.go:215. Not pool-specific: any
// workload with 4096 parked blocks in one (stream, pool) crashes.
func TestRegressionFreeAfterCoalesce(t *testing.T) {
	a := newAlloc(t, vmmtest.HostDriver(t, 1<<30), ClassicConfig())
	var ps []vmm.DevicePtr
	for range 4200 {
		p, err := a.Alloc(512, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	for i := 1; i <= 4098; i++ {
		require.NoError(t, a.Free(ps[i]))
	}
}

// TestRegressionOOMRetryDuringCapture: the OOM policy sleeps between retries
// with the lock released; a capture begun meanwhile does not stop the
// retry from emptying the cache (stream syncs and unmaps during capture,
// internal/core/oom.go, the retry loop's releaseAllLocked).
func TestRegressionOOMRetryDuringCapture(t *testing.T) {
	cfg := ClassicConfig()
	cfg.OOMMaxRetries = 1
	cfg.OOMDelay = 300 * time.Millisecond
	e := newPoolEnv(t, 100<<20, cfg)
	sleeping := oomSleeper(e)
	b1 := e.alloc(40<<20, 0)
	b2 := e.alloc(40<<20, 0)
	done := make(chan error, 1)
	go func() {
		_, err := e.a.Alloc(40<<20, e.side)
		done <- err
	}()
	<-sleeping
	e.free(b2) // two whole free pages in the shared pools
	A := pid(1)
	e.begin(A, onStream(e.s))
	err := <-done
	e.noViolations()
	e.end(A)
	if err == nil {
		t.Log("the retry succeeded")
	}
	e.free(b1)
	require.NoError(t, e.a.ReleasePool(A))
}

// TestRegressionThresholdCountsPoolFreeBytes: trimLocked compares the free
// bytes of all mapped pages, a retained pool's included, with the release
// threshold, but can unmap only shared pages: with a pool holding more
// free bytes than the threshold, every Free in the shared pools unmaps
// every whole free shared page (a stream sync each time) and the next
// allocation maps them again (internal/core/release.go freeMappedLocked).
func TestRegressionThresholdCountsPoolFreeBytes(t *testing.T) {
	cfg := ClassicConfig()
	cfg.ReleaseThreshold = 50 << 20
	e := newPoolEnv(t, 1<<30, cfg)
	A := pid(1)
	require.NoError(t, e.a.RetainPool(A))
	e.free(e.allocIn(A, 100<<20, 0))
	unmaps := e.a.Stats().Unmaps
	for range 5 {
		e.free(e.alloc(20<<20, 0)) // 20 MiB free in the shared pools: under the threshold
	}
	require.Equal(t, unmaps, e.a.Stats().Unmaps, "shared pages under the threshold were unmapped")
	require.NoError(t, e.a.ReleasePool(A))
}

// oomSleeper sets e up so that an allocation on the side stream runs out of
// memory and sleeps between OOM retries, and returns a channel that is
// signalled when it does (while the Heap's lock is still held: the next
// call waits for the sleep to begin).
func oomSleeper(e *poolEnv) <-chan struct{} {
	sleeping := make(chan struct{}, 1)
	e.log.SetOnMsg(func(msg string) {
		if msg == "xseg: out of memory, retrying after a delay" {
			select {
			case sleeping <- struct{}{}:
			default:
			}
		}
	})
	return sleeping
}

// TestPoolOOMRetryRacingCapture: an allocation sleeping between OOM
// retries wakes up inside a capture begun meanwhile, in which the pool was
// released. Its retry must not give the released (but still active) pool
// back: no device sync during the capture, and the pool's route still
// works (giving it back deleted the pool under its route: a nil
// dereference at the next routed allocation).
func TestPoolOOMRetryRacingCapture(t *testing.T) {
	cfg := ClassicConfig()
	cfg.OOMMaxRetries = 1
	cfg.OOMDelay = 400 * time.Millisecond
	e := newPoolEnv(t, 110<<20, cfg) // 80 MiB shared + a page of A + a small page
	sleeping := oomSleeper(e)
	b1 := e.alloc(40<<20, 0)
	b2 := e.alloc(40<<20, 0)
	done := make(chan error, 1)
	go func() {
		_, err := e.a.Alloc(40<<20, e.side)
		done <- err
	}()
	<-sleeping
	A := pid(1)
	e.begin(A, onStream(e.s))
	e.free(e.alloc(20<<20, e.s)) // a whole free page in A
	require.NoError(t, e.a.ReleasePool(A))
	require.ErrorIs(t, <-done, vmm.ErrOutOfMemory)
	p := e.alloc(4096, e.s)
	require.Equal(t, A, e.poolOf(p), "the route of the active pool still works")
	e.free(p)
	require.Equal(t, 0, e.f.Calls(vmmtest.OpDeviceSynchronize))
	e.noViolations()
	e.end(A)
	require.Empty(t, poolSegments(e.a, A))
	e.free(b1, b2)
}
