package core_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestWarmPathsTakeTurns has goroutines use one allocator in long runs of
// warm pairs, long enough for the Heap's lock to bias itself to each in
// turn (heaplock.go), first one after another and then all at once, with
// cold calls (a new size, Stats, EmptyCache) among them. No address is
// ever handed to two goroutines at once, and the statistics end where
// they began.
func TestWarmPathsTakeTurns(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 8<<30), core.DefaultConfig())
		const workers, runs, pairs = 4, 6, 300
		sizes := []uint64{512, 4 << 10, 300 << 10, 3 * mib, 12 * mib}
		var mu sync.Mutex
		live := map[vmm.DevicePtr]int{}
		take := func(w int, p vmm.DevicePtr) {
			mu.Lock()
			defer mu.Unlock()
			if o, ok := live[p]; ok {
				t.Errorf("%v handed to goroutine %d while goroutine %d holds it", p, w, o)
			}
			live[p] = w
		}
		give := func(p vmm.DevicePtr) {
			mu.Lock()
			defer mu.Unlock()
			delete(live, p)
		}
		work := func(w, run int) {
			held := make([]vmm.DevicePtr, 0, len(sizes))
			for _, n := range sizes { // a neighbour that stays for the run
				p, err := a.Alloc(n, 0)
				require.NoError(t, err)
				take(w, p)
				held = append(held, p)
			}
			for i := range pairs {
				n := sizes[i%len(sizes)]
				if i%97 == 0 {
					n += uint64(1+w+run) << 9 // a size not seen yet
				}
				p, err := a.Alloc(n, 0)
				require.NoError(t, err)
				take(w, p)
				give(p)
				require.NoError(t, a.Free(p))
				switch i % 149 {
				case 50:
					a.Stats()
				case 100:
					require.NoError(t, a.EmptyCache())
				}
			}
			for _, p := range held {
				give(p)
				require.NoError(t, a.Free(p))
			}
		}
		for run := range runs { // one after another
			for w := range workers {
				work(w, run)
			}
		}
		var wg sync.WaitGroup
		for w := range workers { // all at once
			wg.Go(func() {
				for run := range runs {
					work(w, run)
				}
			})
		}
		wg.Wait()
		st := a.Stats()
		require.Zero(t, st.AllocatedBytes.All.Current)
		require.Zero(t, st.ActiveBlocks.All.Current)
		require.Equal(t, int64(2*workers*runs*(pairs+len(sizes))), st.Allocations.All.Allocated)
		require.NoError(t, a.EmptyCache())
		require.Zero(t, a.Stats().ReservedBytes.All.Current)
	})
}
