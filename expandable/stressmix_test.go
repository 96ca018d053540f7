package expandable

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// The stress tests below mix every call of the allocator from many
// goroutines on several streams, with Close racing them at the end, and
// check the books after: the statistics agree with a snapshot taken under
// the same lock, the driver holds after Close what it held before, no
// goroutine is left behind. Run them under -race and with the build tag
// invariants (the core checks its books after every call).

// mixSizes repeat, so that the warm paths (exact-size reuse) run, and
// reach past one page, so that growth and unmapping run.
var mixSizes = []uint64{512, 512, 4096, 4096, 65536, 1 << 20, 3 << 20, 512 << 10}

// okMixErr reports whether err is one a mixed run may see: out of memory
// (a small device), closed (Close raced the call), invalid (a stream
// destroyed meanwhile) or in use (EmptyCache while another goroutine
// captures).
func okMixErr(err error) bool {
	return err == nil || errors.Is(err, vmm.ErrOutOfMemory) || errors.Is(err, vmm.ErrClosed) ||
		errors.Is(err, vmm.ErrInvalid) || errors.Is(err, spec.ErrNotAllocated) || errors.Is(err, vmm.ErrInUse)
}

// checkSnapshot checks that snap's statistics are what its blocks and
// mapped ranges say.
func checkSnapshot(t *testing.T, snap spec.Snapshot) {
	t.Helper()
	var alloc, active, mapped int64
	var allocs, actives int64
	for _, seg := range snap.Segments {
		for _, r := range seg.Mapped {
			mapped += int64(r.Size)
		}
		for _, b := range seg.Blocks {
			switch b.State {
			case spec.BlockAllocated:
				alloc += int64(b.Size)
				allocs++
				active += int64(b.Size)
				actives++
			case spec.BlockPending:
				active += int64(b.Size)
				actives++
			}
		}
	}
	st := snap.Stats
	require.Equal(t, alloc, st.AllocatedBytes.All.Current, "allocated bytes")
	require.Equal(t, allocs, st.Allocations.All.Current, "allocations")
	require.Equal(t, active, st.ActiveBytes.All.Current, "active bytes")
	require.Equal(t, actives, st.ActiveBlocks.All.Current, "active blocks")
	require.LessOrEqual(t, mapped, st.ReservedBytes.All.Current, "mapped bytes above reserved")
	require.GreaterOrEqual(t, st.AllocatedBytes.All.Peak, st.AllocatedBytes.All.Current)
	require.GreaterOrEqual(t, st.ReservedBytes.All.Current, st.AllocatedBytes.All.Current)
}

// mixRun is one stressed allocator: workers run ops ops each unless
// Close comes first.
type mixRun struct {
	t *testing.T
	d *host.Driver
	// g is between d and a; with arm, armed while pool has a pool active
	// (not when Close races: Close gives everything back, pool or not).
	g       *vmmtest.CaptureGuard
	arm     bool
	a       *Allocator
	streams []vmm.Stream // the first is 0; the others may be destroyed
	smu     sync.Mutex   // guards streams[1:] against the destroyer
	closed  atomic.Bool
	fails   atomic.Int64 // calls that failed with an allowed error
}

func (m *mixRun) stream(rng *rand.Rand) vmm.Stream {
	m.smu.Lock()
	defer m.smu.Unlock()
	return m.streams[rng.IntN(len(m.streams))]
}

func (m *mixRun) note(err error) {
	if err == nil {
		return
	}
	if !okMixErr(err) {
		m.t.Errorf("unexpected error: %v", err)
		return
	}
	if errors.Is(err, vmm.ErrClosed) && !m.closed.Load() {
		m.t.Errorf("ErrClosed before Close: %v", err)
	}
	m.fails.Add(1)
}

// worker runs random calls; it frees what it holds at the end.
func (m *mixRun) worker(g, ops int) {
	rng := rand.New(rand.NewPCG(uint64(g), 99))
	var live []vmm.DevicePtr
	free := func(j int) {
		m.note(m.a.Free(live[j]))
		live = append(live[:j], live[j+1:]...)
	}
	for i := 0; i < ops && !m.closed.Load(); i++ {
		switch op := rng.IntN(40); {
		case op < 16 || len(live) == 0:
			s := vmm.Stream(0)
			if rng.IntN(3) == 0 {
				s = m.stream(rng)
			}
			p, err := m.a.Alloc(mixSizes[rng.IntN(len(mixSizes))], s)
			m.note(err)
			if err == nil {
				live = append(live, p)
			}
		case op < 30:
			free(rng.IntN(len(live)))
		case op < 32:
			j := rng.IntN(len(live))
			m.note(m.a.RecordStream(live[j], m.stream(rng)))
			free(j)
		case op == 32:
			p, n, err := m.a.AllocAtMost(8<<20, 512, m.stream(rng))
			m.note(err)
			if err == nil {
				require.GreaterOrEqual(m.t, n, uint64(512))
				live = append(live, p)
			}
		case op == 33:
			m.note(m.a.EmptyCache())
		case op == 34:
			m.note(m.a.SetMemoryFraction([]float64{0, 0.5, 1}[rng.IntN(3)]))
		case op == 35:
			m.a.ResetPeakStats()
		case op == 36:
			m.a.ResetAccumulatedStats()
		case op == 37:
			snap := m.a.Snapshot()
			if !m.closed.Load() {
				checkSnapshot(m.t, snap)
			}
		case op == 38:
			_ = m.a.Stats()
			m.g.Hold.Store(rng.IntN(2) == 0) // events complete only when waited for
		default:
			m.pool(rng, uint64(g))
		}
		if m.t.Failed() {
			break
		}
	}
	for _, p := range live {
		m.note(m.a.Free(p))
	}
}

// pool runs a short capture: allocations on a stream routed to a private
// pool, frees inside and after it, then the pool's release.
func (m *mixRun) pool(rng *rand.Rand, g uint64) {
	id := core.PoolID{First: 7, Second: g + 1}
	s := m.stream(rng)
	if err := m.a.BeginAllocateToPool(id, func(x vmm.Stream) bool { return x == s && s != 0 }); err != nil {
		m.note(err)
		return
	}
	if m.arm {
		m.g.Armed.Add(1)
	}
	var ps []vmm.DevicePtr
	for range 1 + rng.IntN(4) {
		p, err := m.a.Alloc(mixSizes[rng.IntN(len(mixSizes))], s)
		m.note(err)
		if err == nil {
			ps = append(ps, p)
		}
	}
	if len(ps) > 0 {
		m.note(m.a.Free(ps[0]))
		ps = ps[1:]
	}
	if m.arm {
		m.g.Armed.Add(-1)
	}
	m.note(m.a.EndAllocateToPool(id))
	for _, p := range ps {
		m.note(m.a.Free(p))
	}
	m.note(m.a.ReleasePool(id))
}

// destroyer destroys and makes again the last stream now and then.
func (m *mixRun) destroyer(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(2 * time.Millisecond):
		}
		m.smu.Lock()
		last := len(m.streams) - 1
		old := m.streams[last]
		s, err := m.d.StreamCreate(0)
		if err != nil {
			m.smu.Unlock()
			m.t.Errorf("creating a stream: %v", err)
			return
		}
		m.streams[last] = s
		m.smu.Unlock()
		if err := m.d.StreamDestroy(old); err != nil {
			m.t.Errorf("destroying a stream: %v", err)
			return
		}
	}
}

// stressMix runs workers goroutines of ops calls each on an allocator of
// cfg over a host device of capacity bytes, with a stream destroyed and
// made again meanwhile; with closeEarly, Close races the workers.
func stressMix(t *testing.T, cfg Config, capacity uint64, workers, ops int, closeEarly bool) {
	g0 := runtime.NumGoroutine()
	d, err := host.Open(host.Options{Capacity: capacity})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	u0 := d.Usage()
	g := &vmmtest.CaptureGuard{Driver: d}
	a, err := New(g, 0, cfg, nil)
	require.NoError(t, err)
	m := &mixRun{t: t, d: d, g: g, arm: !closeEarly, a: a, streams: []vmm.Stream{0}}
	for range 3 {
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		m.streams = append(m.streams, s)
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() { m.destroyer(stop) })
	var wg sync.WaitGroup
	for g := range workers {
		wg.Go(func() { m.worker(g, ops) })
	}
	if closeEarly {
		wg.Go(func() {
			time.Sleep(time.Duration(20+ops/50) * time.Millisecond)
			m.closed.Store(true)
			require.NoError(t, a.Close())
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(time.Minute):
		buf := make([]byte, 1<<22)
		t.Fatalf("workers stuck:\n%s", buf[:runtime.Stack(buf, true)])
	}
	close(stop)
	bg.Wait()
	require.Empty(t, g.Violations(), "driver calls that a capture forbids, made while a pool was active")
	g.Hold.Store(false)
	if !m.closed.Load() {
		// Frees deferred while another goroutine captured stay pending
		// until the next allocation or EmptyCache.
		require.NoError(t, a.EmptyCache())
		snap := a.Snapshot()
		checkSnapshot(t, snap)
		require.Zero(t, snap.Stats.AllocatedBytes.All.Current)
		require.Zero(t, snap.Stats.ActiveBytes.All.Current)
		require.Zero(t, snap.Stats.ReservedBytes.All.Current)
		require.Empty(t, snap.Segments)
		m.closed.Store(true)
	}
	require.NoError(t, a.Close())
	require.NoError(t, a.Close())
	_, err = a.Alloc(512, 0)
	require.ErrorIs(t, err, vmm.ErrClosed)
	for _, s := range m.streams[1:] {
		require.NoError(t, d.StreamDestroy(s))
	}
	require.Equal(t, u0, d.Usage(), "driver usage after Close")
	vmmtest.WaitGoroutines(t, g0, 2*time.Second)
}

// TestStressMix: every call mixed from 8 goroutines on 4 streams (one of
// them destroyed and made again meanwhile), private pools begun and ended
// among them, under the default and the classic configuration, on a
// device big enough and on one so small that allocations run out and wait
// for frees (OOMWait) and retry; then Close.
func TestStressMix(t *testing.T) {
	small := func(cfg Config) Config {
		cfg.OOMWait = 2 * time.Millisecond
		cfg.OOMMaxRetries = 1
		cfg.OOMDelay = time.Millisecond
		return cfg
	}
	for _, tc := range []struct {
		name     string
		cfg      Config
		capacity uint64
	}{
		{"default", DefaultConfig(), 0},
		{"classic", ClassicConfig(), 0},
		{"recycle chunks", chunksRecycleConfig(), 0},
		{"settle chains", settleChainsConfig(), 0},
		{"oom default", small(DefaultConfig()), 24 << 20},
		{"oom classic", small(ClassicConfig()), 48 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) { stressMix(t, tc.cfg, tc.capacity, 8, 1500, false) })
	}
}

// TestStressMixClose: as TestStressMix, with Close racing the workers.
func TestStressMixClose(t *testing.T) {
	for i := range 6 {
		cfg := DefaultConfig()
		if i%2 == 1 {
			cfg = ClassicConfig()
		}
		cfg.OOMWait = 50 * time.Millisecond
		cfg.OOMMaxRetries = 2
		cfg.OOMDelay = 20 * time.Millisecond
		t.Run("", func(t *testing.T) { stressMix(t, cfg, 32<<20, 8, 1000+200*i, true) })
	}
}
