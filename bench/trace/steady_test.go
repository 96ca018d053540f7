package trace_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bench/trace"
)

// periodicTrace is a training loop's shape, made up from seed: long-lived
// blocks (a model's weights and optimizer state), then one step of
// allocations and frees, with activations of 64 KiB to 32 MiB that live
// for part of the step and a few temporaries of 64 to 400 MiB that live
// for a few events, repeated exactly periods times (the same sizes in the
// same order every step, as a loop at a fixed batch size makes them).
func periodicTrace(t *testing.T, seed uint64, periods int) *trace.Trace {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0))
	var b strings.Builder
	id := 0
	for range 20 + rng.IntN(20) {
		fmt.Fprintf(&b, "a %d %d 0\n", id, (1+rng.Uint64N(64))<<20)
		id++
	}
	type ev struct {
		alloc bool
		slot  int    // the step's own numbering of its blocks
		size  uint64 // of an alloc
	}
	var step []ev
	var live []int
	slots := 0
	for range 300 {
		switch r := rng.Float64(); {
		case r < 0.08: // a temporary, freed a few events on
			step = append(step, ev{alloc: true, slot: slots, size: (64 + rng.Uint64N(336)) << 20})
			live = append(live, slots)
			slots++
		case r < 0.55 || len(live) == 0:
			step = append(step, ev{alloc: true, slot: slots, size: (64 << 10) << rng.UintN(10)})
			live = append(live, slots)
			slots++
		default:
			i := len(live) - 1 - rng.IntN(min(len(live), 6)) // mostly the newest: a stack with some crossing
			step = append(step, ev{slot: live[i]})
			live = append(live[:i], live[i+1:]...)
		}
	}
	for _, s := range live {
		step = append(step, ev{slot: s})
	}
	for range periods {
		ids := make([]int, slots)
		for _, e := range step {
			if e.alloc {
				ids[e.slot] = id
				fmt.Fprintf(&b, "a %d %d 0\n", id, e.size)
				id++
			} else {
				fmt.Fprintf(&b, "f %d\n", ids[e.slot])
			}
		}
	}
	tr, err := trace.Parse(fmt.Sprintf("periodic(seed %d, %d steps)", seed, periods), strings.NewReader(b.String()))
	require.NoError(t, err)
	return tr
}

// TestSteadyPolicy replays made-up training loops (periodicTrace, eight
// seeds) of 4 and of 24 steps under SteadyConfig and under the default.
// Under SteadyConfig nothing is unmapped, and the 20 steps more map no
// page and reserve no byte more: its layout settles in the first steps.
// The default's tight layout holds less, but on some of these loops it
// moves pages in every step (logged; bench/RESULTS.md round 38), which
// Result.LateMaps shows and steady's does not.
func TestSteadyPolicy(t *testing.T) {
	d := hostDriver(t)
	steady := xseg.SteadyConfig()
	var late int64
	for seed := range uint64(8) {
		short, long := periodicTrace(t, seed, 4), periodicTrace(t, seed, 24)
		s4, s24 := replayWith(t, d, short, steady), replayWith(t, d, long, steady)
		require.Zero(t, s4.Unmaps+s24.Unmaps, "seed %d: steady unmapped pages", seed)
		require.Equal(t, s4.Maps, s24.Maps, "seed %d: steady mapped pages after the fourth step", seed)
		require.Equal(t, s4.PeakReserved, s24.PeakReserved, "seed %d: steady reserved more after the fourth step", seed)
		require.Zero(t, s24.LateMaps, "seed %d: steady mapped in the second half", seed)
		d4, d24 := replayWith(t, d, short, xseg.DefaultConfig()), replayWith(t, d, long, xseg.DefaultConfig())
		require.LessOrEqual(t, d24.Ratio, s24.Ratio, "seed %d: the default held more than steady", seed)
		// The second half is steps 12 to 24: within what came after the
		// fourth.
		require.LessOrEqual(t, d24.LateMaps, d24.Maps-d4.Maps, "seed %d", seed)
		late = max(late, d24.LateMaps)
		t.Logf("seed %d: steady %.4f, %d maps; default %.4f, %d maps in 4 steps and %.1f a step after",
			seed, s24.Ratio, s24.Maps, d24.Ratio, d4.Maps, float64(d24.Maps-d4.Maps)/20)
	}
	require.Positive(t, late, "the default kept mapping on none of the loops")
}
