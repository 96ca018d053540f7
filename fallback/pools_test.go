package fallback

import (
	"bytes"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// The private pools of the fallback allocator: the same core as the
// expandable allocator's (see expandable/pools_test.go for the full set),
// over segments that are plain allocations. A table of the cases where the
// backing matters: segments instead of pages, MemFree (which synchronizes
// the device on CUDA) instead of unmap, and the allocator's own release
// threshold, which calls EmptyCache.

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

func pid(n uint64) core.PoolID { return core.PoolID{Second: n} }

func onStream(s vmm.Stream) func(vmm.Stream) bool {
	return func(x vmm.Stream) bool { return x == s }
}

func (e *poolEnv) begin(id core.PoolID) {
	e.t.Helper()
	require.NoError(e.t, e.a.BeginAllocateToPool(id, onStream(e.s)))
	e.g.Armed.Add(1)
}

func (e *poolEnv) end(id core.PoolID) {
	e.t.Helper()
	e.g.Armed.Add(-1)
	require.NoError(e.t, e.a.EndAllocateToPool(id))
}

func (e *poolEnv) alloc(size uint64, s vmm.Stream) vmm.DevicePtr {
	e.t.Helper()
	p, err := e.a.Alloc(size, s)
	require.NoError(e.t, err, "Alloc(%d)", size)
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

func (e *poolEnv) noViolations() {
	e.t.Helper()
	require.Empty(e.t, e.g.Violations(), "calls illegal during stream capture were made while a pool was active")
}

func (e *poolEnv) segments(id core.PoolID) []core.Segment {
	var out []core.Segment
	for _, seg := range e.a.Snapshot().Segments {
		if seg.PrivatePool == id {
			out = append(out, seg)
		}
	}
	return out
}

func (e *poolEnv) poolOf(p vmm.DevicePtr) core.PoolID {
	e.t.Helper()
	for _, seg := range e.a.Snapshot().Segments {
		if p >= seg.Base && p < seg.Base.Add(seg.Reserved) {
			return seg.PrivatePool
		}
	}
	e.t.Fatalf("%v is in no segment", p)
	return core.PoolID{}
}

// outside checks that [p, p+size) overlaps no segment of pool id.
func (e *poolEnv) outside(p vmm.DevicePtr, size uint64, id core.PoolID) {
	e.t.Helper()
	segs := e.segments(id)
	require.NotEmpty(e.t, segs)
	for _, seg := range segs {
		require.False(e.t, p < seg.Base.Add(seg.Reserved) && seg.Base < p.Add(size),
			"block %v+%d overlaps segment %v+%d of pool %v", p, size, seg.Base, seg.Reserved, id)
	}
}

func (e *poolEnv) tag(p vmm.DevicePtr, tag byte) {
	e.t.Helper()
	require.NoError(e.t, e.host.CopyHtoD(p, bytes.Repeat([]byte{tag}, 64)))
}

func (e *poolEnv) checkTag(p vmm.DevicePtr, tag byte) {
	e.t.Helper()
	got := make([]byte, 64)
	require.NoError(e.t, e.host.CopyDtoH(got, p))
	require.Equal(e.t, bytes.Repeat([]byte{tag}, 64), got, "block %v was overwritten", p)
}

func TestPools(t *testing.T) {
	A, B := pid(1), pid(2)
	withThreshold := DefaultConfig()
	withThreshold.ReleaseThreshold = 1 // give every wholly free segment back at each free
	cases := []struct {
		name string
		cfg  Config
		cap  uint64
		run  func(e *poolEnv)
	}{
		{"CaptureAddressesStayPrivate", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			for _, size := range []uint64{512, 1 * mib, 3 * mib, 25 * mib} {
				e.begin(A)
				tmp := e.alloc(size, e.s)
				y := e.alloc(size, e.s)
				e.tag(y, 1)
				e.free(tmp)
				e.end(A)
				e.begin(B)
				w := e.alloc(size, e.s)
				require.NotEqual(e.t, tmp, w)
				require.Equal(e.t, B, e.poolOf(w))
				e.outside(w, size, A)
				e.tag(w, 2)
				e.end(B)
				for range 3 {
					x := e.alloc(size, e.s)
					require.Equal(e.t, core.PoolID{}, e.poolOf(x))
					e.outside(x, size, A)
					e.outside(x, size, B)
					e.tag(x, 3)
				}
				e.checkTag(y, 1)
				e.checkTag(w, 2)
				require.Equal(e.t, A, e.poolOf(e.allocIn(A, size, e.s)))
			}
		}},
		{"TempReusedOnlyInPool", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			e.begin(A)
			tmp := e.alloc(3*mib, e.s)
			e.free(tmp)
			require.Equal(e.t, tmp, e.alloc(3*mib, e.s), "reused within the active pool")
			e.free(tmp)
			e.end(A)
			for range 3 {
				q := e.alloc(3*mib, e.s)
				require.NotEqual(e.t, tmp, q)
				e.outside(q, 3*mib, A)
			}
		}},
		{"ReleaseFreesSegments", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			keep := e.alloc(4096, 0)
			base := e.host.Usage()
			e.begin(A)
			ps := []vmm.DevicePtr{e.alloc(512, e.s), e.alloc(3*mib, e.s), e.alloc(30*mib, e.s)}
			e.end(A)
			e.free(ps...)
			require.NoError(e.t, e.a.EmptyCache())
			require.Len(e.t, e.segments(A), 3, "EmptyCache keeps a retained pool's segments")
			syncs := e.f.Calls(vmmtest.OpDeviceSynchronize)
			require.NoError(e.t, e.a.ReleasePool(A))
			require.Equal(e.t, syncs+1, e.f.Calls(vmmtest.OpDeviceSynchronize), "one device sync before the segments go")
			require.Empty(e.t, e.segments(A))
			require.Equal(e.t, base.Allocs, e.host.Usage().Allocs)
			require.Equal(e.t, base.AllocBytes, e.host.Usage().AllocBytes)
			e.free(keep)
		}},
		{"ReleaseWithLiveBlock", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			require.NoError(e.t, e.a.RetainPool(A))
			live := e.allocIn(A, 3*mib, 0)
			e.free(e.allocIn(A, 30*mib, 0))
			require.NoError(e.t, e.a.ReleasePool(A))
			require.Len(e.t, e.segments(A), 1, "the free segment went, the live block's stays")
			require.Equal(e.t, 1, e.host.Usage().Allocs)
			e.free(live)
			require.Empty(e.t, e.segments(A))
			require.Zero(e.t, e.host.Usage().Allocs)
		}},
		{"SyncBeforeFreeingCoalescedSegment", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			// Two halves of one small segment, parked in exact-size lists:
			// wholly free only once coalesced.
			require.NoError(e.t, e.a.RetainPool(A))
			e.free(e.allocIn(A, 1*mib, 0), e.allocIn(A, 1*mib, 0))
			syncs := e.f.Calls(vmmtest.OpDeviceSynchronize)
			require.NoError(e.t, e.a.ReleasePool(A))
			require.Equal(e.t, syncs+1, e.f.Calls(vmmtest.OpDeviceSynchronize))
			require.Empty(e.t, e.segments(A))
			require.Zero(e.t, e.host.Usage().Allocs)
		}},
		{"LiveBlockUsedOnAnotherStream", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			require.NoError(e.t, e.a.RetainPool(A))
			live := e.allocIn(A, 3*mib, 0)
			require.NoError(e.t, e.a.RecordStream(live, e.side))
			require.NoError(e.t, e.a.ReleasePool(A))
			e.g.Hold.Store(true)
			e.free(live)
			require.Empty(e.t, e.segments(A), "the released pool went at its last free, after a device sync")
			require.Zero(e.t, e.host.Usage().Allocs)
		}},
		{"NoForbiddenCallsDuringCapture", withThreshold, 1 << 30, func(e *poolEnv) {
			require.NoError(e.t, e.a.RetainPool(B))
			e.free(e.allocIn(B, 3*mib, 0))
			sh := e.alloc(1*mib, 0)
			require.NoError(e.t, e.a.RecordStream(sh, e.side))
			e.g.Hold.Store(true)
			e.begin(A)
			x := e.alloc(3*mib, e.s)
			require.NoError(e.t, e.a.RecordStream(x, e.side))
			e.free(x)
			x2 := e.alloc(3*mib, e.s)
			require.NotEqual(e.t, x, x2, "a deferred free is not reused during capture")
			big := e.alloc(50*mib, e.s) // a new segment of the pool
			other := e.alloc(40*mib, 0)
			allocs := e.host.Usage().Allocs
			e.free(other, big, sh) // frees above the threshold: no segment is freed during capture
			require.Equal(e.t, allocs, e.host.Usage().Allocs, "the release threshold waits for the capture to end")
			require.ErrorIs(e.t, e.a.EmptyCache(), vmm.ErrInUse)
			require.NoError(e.t, e.a.ReleasePool(B))
			require.NotEmpty(e.t, e.segments(B))
			e.noViolations()
			e.end(A)
			require.Empty(e.t, e.segments(B), "B goes once no pool is active")
			require.NotEqual(e.t, x, e.allocIn(A, 3*mib, e.s), "its event has not completed")
			e.g.Hold.Store(false)
			require.Equal(e.t, x, e.allocIn(A, 3*mib, e.s))
		}},
		{"OOMDuringCapture", func() Config {
			c := DefaultConfig()
			c.OOMMaxRetries, c.OOMDelay, c.OOMWait = 2, 100*time.Millisecond, time.Second
			return c
		}(), 100 * mib, func(e *poolEnv) {
			e.free(e.alloc(60*mib, 0)) // a free shared segment an OOM would free
			e.begin(A)
			start := time.Now()
			_, err := e.a.Alloc(60*mib, e.s)
			require.ErrorIs(e.t, err, vmm.ErrOutOfMemory)
			require.Less(e.t, time.Since(start), 500*time.Millisecond, "no wait or retry during capture")
			require.Equal(e.t, 1, e.host.Usage().Allocs, "the shared segment was not freed")
			e.noViolations()
			e.end(A)
			p := e.allocIn(A, 60*mib, e.s)
			e.free(p)
		}},
		{"OOMKeepsRetainedPool", func() Config {
			c := DefaultConfig()
			c.OOMMaxRetries, c.OOMDelay = 1, time.Millisecond
			return c
		}(), 100 * mib, func(e *poolEnv) {
			require.NoError(e.t, e.a.RetainPool(A))
			e.free(e.allocIn(A, 60*mib, 0))
			_, err := e.a.Alloc(60*mib, 0)
			require.ErrorIs(e.t, err, vmm.ErrOutOfMemory, "only the retained pool's free segment could serve it")
			require.Len(e.t, e.segments(A), 1)
			require.NoError(e.t, e.a.ReleasePool(A))
			e.free(e.alloc(60*mib, 0))
		}},
		{"CheckpointRestore", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			require.NoError(e.t, e.a.RetainPool(A))
			b0 := e.allocIn(A, 2*mib, 0)
			b1 := e.allocIn(A, 3*mib, 0)
			b2 := e.allocIn(A, 2*mib, 0)
			cp, err := e.a.CheckpointPool(A)
			require.NoError(e.t, err)
			e.free(b1)
			c := e.allocIn(A, 4*mib, 0)
			freed, allocated, err := e.a.RestorePool(cp)
			require.NoError(e.t, err)
			require.Equal(e.t, []vmm.DevicePtr{c}, freed)
			require.Equal(e.t, []vmm.DevicePtr{b1}, allocated)
			ptrs, err := e.a.PoolAllocations(A)
			require.NoError(e.t, err)
			require.Equal(e.t, slices.Sorted(slices.Values([]vmm.DevicePtr{b0, b1, b2})), ptrs)
			e.begin(B)
			_, _, err = e.a.RestorePool(cp)
			require.ErrorIs(e.t, err, vmm.ErrInUse)
			e.end(B)
			require.NoError(e.t, e.a.ReleasePool(B))
			e.free(b0, b1, b2)
			require.NoError(e.t, e.a.ReleasePool(A))
			require.Zero(e.t, e.host.Usage().Allocs)
		}},
		{"MemFreeFailsAtRelease", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			require.NoError(e.t, e.a.RetainPool(A))
			e.free(e.allocIn(A, 3*mib, 0), e.allocIn(A, 30*mib, 0))
			e.f.FailNth(vmmtest.OpMemFree, 1, nil)
			require.ErrorIs(e.t, e.a.ReleasePool(A), vmmtest.ErrInjected)
			require.Len(e.t, e.segments(A), 1)
			st := e.a.Stats()
			require.Equal(e.t, int64(e.host.Usage().AllocBytes), st.ReservedBytes.All.Current)
			require.Equal(e.t, int64(1), st.Segments.All.Current)
			require.NoError(e.t, e.a.EmptyCache())
			require.Empty(e.t, e.segments(A))
			require.Zero(e.t, e.host.Usage().Allocs)
			require.Zero(e.t, e.a.Stats().ReservedBytes.All.Current)
		}},
		{"DeviceSyncFailsAtEnd", DefaultConfig(), 1 << 30, func(e *poolEnv) {
			require.NoError(e.t, e.a.RetainPool(A))
			e.free(e.allocIn(A, 3*mib, 0))
			e.begin(B)
			require.NoError(e.t, e.a.ReleasePool(A))
			e.f.FailNth(vmmtest.OpDeviceSynchronize, 1, nil)
			e.end(B)
			require.True(e.t, e.log.Contains("giving a released pool's memory back"))
			require.Len(e.t, e.segments(A), 1)
			require.NoError(e.t, e.a.ReleasePool(B))
			require.NoError(e.t, e.a.EmptyCache())
			require.Empty(e.t, e.segments(A))
			require.Zero(e.t, e.host.Usage().Allocs)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newPoolEnv(t, tc.cap, tc.cfg)
			tc.run(e)
			e.noViolations()
		})
	}
}
