package trace_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bench/trace"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// lagDriver is the host backend with a GPU that runs behind the program:
// an event recorded when the replay had made n allocations and frees
// completes once it has made n+lag, or once something waited for it.
// The program also waits for the GPU every step events after the first
// pre (a training loop's loss.item() or torch.cuda.synchronize()). It
// counts the waits the allocator asks of the driver.
type lagDriver struct {
	vmm.Driver
	lag, pre, step int64
	clk, synced    int64 // events replayed; every event recorded before synced is done
	rec            map[vmm.Event]int64
	waits          int
	failEvery      int // every failEvery-th EventCreate, EventRecord and EventQuery fails, if > 0
	calls          int
}

func newLagDriver(t *testing.T, lag, pre, step int64) *lagDriver {
	return &lagDriver{Driver: hostDriver(t), lag: lag, pre: pre, step: step, rec: map[vmm.Event]int64{}}
}

func (d *lagDriver) tick() {
	d.clk++
	if d.clk > d.pre && (d.clk-d.pre)%d.step == 0 {
		d.synced = d.clk
	}
}

// fail reports an injected failure of the driver's next event call.
func (d *lagDriver) fail(op string) error {
	if d.calls++; d.failEvery > 0 && d.calls%d.failEvery == 0 {
		return fmt.Errorf("lagDriver: %s (event call %d) fails", op, d.calls)
	}
	return nil
}

func (d *lagDriver) EventCreate(dev vmm.Device) (vmm.Event, error) {
	if err := d.fail("EventCreate"); err != nil {
		return 0, err
	}
	return d.Driver.EventCreate(dev)
}

func (d *lagDriver) EventRecord(e vmm.Event, s vmm.Stream) error {
	if err := d.fail("EventRecord"); err != nil {
		return err
	}
	if err := d.Driver.EventRecord(e, s); err != nil {
		return err
	}
	d.rec[e] = d.clk
	return nil
}

func (d *lagDriver) EventQuery(e vmm.Event) (bool, error) {
	if _, err := d.Driver.EventQuery(e); err != nil {
		return false, err
	}
	if err := d.fail("EventQuery"); err != nil {
		return false, err
	}
	r := d.rec[e]
	return r+d.lag <= d.clk || r <= d.synced, nil
}

func (d *lagDriver) EventSynchronize(e vmm.Event) error {
	d.waits++
	d.synced = max(d.synced, d.rec[e])
	return d.Driver.EventSynchronize(e)
}

func (d *lagDriver) StreamSynchronize(s vmm.Stream) error {
	d.waits++
	d.synced = d.clk
	return d.Driver.StreamSynchronize(s)
}

func (d *lagDriver) DeviceSynchronize(dev vmm.Device) error {
	d.waits++
	d.synced = d.clk
	return d.Driver.DeviceSynchronize(dev)
}

// lagAllocator moves its driver's clock at every allocation and free.
type lagAllocator struct {
	a trace.Allocator
	d *lagDriver
}

func (l lagAllocator) Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	l.d.tick()
	return l.a.Alloc(size, s)
}

func (l lagAllocator) Free(p vmm.DevicePtr) error {
	l.d.tick()
	return l.a.Free(p)
}

func (l lagAllocator) Stats() spec.Stats { return l.a.Stats() }

// replayLagging replays tr with the default configuration on d, the
// clock moving at every allocation and free.
func replayLagging(t *testing.T, d *lagDriver, tr *trace.Trace) trace.Result {
	t.Helper()
	return replayThrough(t, d, tr, xseg.DefaultConfig(), func(a trace.Allocator) trace.Allocator { return lagAllocator{a, d} })
}

// TestRecordedLoopWaitFree replays GPT-2 small's training loop (its third
// step repeated, loopOf) with the GPU 400 and 1,000 allocations and frees
// behind the allocator and the program waiting for it at the end of each
// step, and counts the allocator's waits in 12 steady steps. A chain
// growth (pack.go) mapped, in every step, pages retired from a block freed
// earlier in the same step, which the GPU had not yet passed: a wait a
// step, the CPU's whole lead lost. A chain is a preference, so it now
// passes over such a hole; the placements where the GPU keeps up are the
// same (the host's, every trace of bench/traces and bench/holdout and
// their variants). Perturbed loops (seeds 1 to 8) still wait where a
// plain growth needs such pages, less often than before (at lag 1,000,
// 23 waits over the 8 x 12 steps, 52 before).
func TestRecordedLoopWaitFree(t *testing.T) {
	const path, first, end = tracesDir + "/gpt2_train.trace.gz", 4570, 6706 // step 3
	short, long := loopOf(t, path, first, end, 4), loopOf(t, path, first, end, 16)
	calm := replayWith(t, hostDriver(t), long, xseg.DefaultConfig())
	for _, lag := range []int64{400, 1000} {
		total := int64(0)
		for seed := range uint64(9) {
			s, l, pre := short, long, int64(first-1)
			if seed > 0 {
				s, l, pre = perturb(t, short, seed), perturb(t, long, seed), pre+1 // the perturbation's first block
			}
			rs := replayLagging(t, newLagDriver(t, lag, pre, end-first), s)
			rl := replayLagging(t, newLagDriver(t, lag, pre, end-first), l)
			waits := rl.Syncs - rs.Syncs
			total += waits
			t.Logf("lag %d, seed %d: %d waits in 12 steady steps; ratio %.5f", lag, seed, waits, rl.Ratio)
			if seed == 0 {
				require.Zero(t, waits, "lag %d: the recorded loop waits for the GPU in its steady steps", lag)
				require.Equal(t, calm.Ratio, rl.Ratio, "lag %d: the recorded loop's ratio", lag)
			}
		}
		require.LessOrEqual(t, total, int64(40), "lag %d: waits in the perturbed loops' steady steps", lag)
	}
	// A driver whose event calls (create, record, query) fail now and
	// then: the allocator cannot tell whether retired pages are idle, so
	// it waits or goes elsewhere; the loop completes with every page and
	// event given back.
	for every := 1; every <= 7; every++ {
		d := newLagDriver(t, 400, first-1, end-first)
		d.failEvery = every
		before := d.Usage()
		rl := replayLagging(t, d, long)
		require.Equal(t, before, d.Usage(), "event calls failing every %d: the driver holds more after the replay", every)
		require.LessOrEqual(t, rl.Ratio, calm.Ratio+0.002, "event calls failing every %d", every)
		t.Logf("event calls failing every %d: ratio %.5f, %d waits", every, rl.Ratio, rl.Syncs)
	}
}

// slowEvents is the host backend with events that, like a GPU's on an
// idle stream, complete a moment after they are recorded rather than at
// once: each reports done only from its third query on.
type slowEvents struct {
	vmm.Driver
	asked map[vmm.Event]int
}

func (d *slowEvents) EventRecord(e vmm.Event, s vmm.Stream) error {
	d.asked[e] = 0
	return d.Driver.EventRecord(e, s)
}

func (d *slowEvents) EventQuery(e vmm.Event) (bool, error) {
	done, err := d.Driver.EventQuery(e)
	d.asked[e]++
	return done && d.asked[e] >= 3, err
}

// TestIdleGPUPlacesAsHost: on a GPU that keeps up, an event recorded just
// now is done a moment later, not at once. A chain growth's question
// whether a hole is busy (retiredBusyLocked) polls its fresh mark, so
// GPT-2's trace and its recorded loop place every block as on the host:
// the same maps, unmaps and ratio.
func TestIdleGPUPlacesAsHost(t *testing.T) {
	const path, first, end = tracesDir + "/gpt2_train.trace.gz", 4570, 6706
	tr, err := trace.ReadFile(path)
	require.NoError(t, err)
	for _, x := range []*trace.Trace{tr, loopOf(t, path, first, end, 8)} {
		host := replayWith(t, hostDriver(t), x, xseg.DefaultConfig())
		slow := replayWith(t, &slowEvents{Driver: hostDriver(t), asked: map[vmm.Event]int{}}, x, xseg.DefaultConfig())
		require.Equal(t, host.Ratio, slow.Ratio, "%s", x.Name)
		require.Equal(t, host.Maps, slow.Maps, "%s", x.Name)
		require.Equal(t, host.Unmaps, slow.Unmaps, "%s", x.Name)
	}
}
