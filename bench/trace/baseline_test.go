package trace_test

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bench/trace"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

var update = flag.Bool("update", false, "TestBaseline: replay every trace and all its baseline variants, and rewrite "+baselinePath)

const (
	tracesDir    = "../traces"
	baselinePath = tracesDir + "/baseline.json"
	// updateCmd regenerates the baseline, from the module's root.
	updateCmd = "go test ./bench/trace -run '^TestBaseline$' -update"
	// baselineSeeds are the variants the baseline holds: seeds 1 to 10.
	baselineSeeds = 10
	// tolerance is how much worse than the baseline a ratio may be: the
	// replays are deterministic, so this only absorbs float printing.
	tolerance = 1e-4
)

// baseline is bench/traces/baseline.json: what the default policy reaches
// on the host backend for each trace of bench/traces and its variants.
type baseline struct {
	About     string          `json:"about"`
	Backend   xseg.Backend    `json:"backend"`
	Allocator string          `json:"allocator"`
	Jitter    float64         `json:"jitter"`
	Traces    []baselineTrace `json:"traces"`
}

type baselineTrace struct {
	Trace  string  `json:"trace"` // the file's name without .trace.gz
	Ratio  float64 `json:"ratio"`
	Maps   int64   `json:"maps"`
	Unmaps int64   `json:"unmaps"`
	// WorstRatio and WorstSeed are the worst of Variants.
	WorstRatio float64           `json:"worst_ratio"`
	WorstSeed  uint64            `json:"worst_seed"`
	Variants   []baselineVariant `json:"variants"`
}

type baselineVariant struct {
	Seed   uint64  `json:"seed"`
	Ratio  float64 `json:"ratio"`
	Maps   int64   `json:"maps"`
	Unmaps int64   `json:"unmaps"`
}

// TestBaseline replays every trace of bench/traces on the host backend
// with the default configuration, and its variants of seeds 1 to 10, and
// fails if a ratio is worse than baseline.json says. A change that makes
// ratios better is logged: regenerate the file (updateCmd) so that the
// gain is kept. The 99 replays of the 9 traces take about 8 s (2 cores);
// with -race, which makes them ten times slower, it replays each trace and
// its variant of seed 1, or the trace alone when it is long (the plain run
// checks the rest). With -tags invariants, whose checks cost far more (65 s with
// -race), it replays gpt2_train and 3 of its variants (about 4 s with
// -race): the ratios are the same, and the plain run checks them all.
// raceVariantEvents: under -race, traces of this many events or more are
// replayed without variants.
const raceVariantEvents = 200_000

func TestBaseline(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(tracesDir, "*.trace.gz"))
	require.NoError(t, err)
	require.NotEmpty(t, paths)
	if *update {
		writeBaseline(t, paths)
		return
	}
	base := readBaseline(t)
	d := hostDriver(t)
	for _, path := range paths {
		name := traceName(path)
		t.Run(name, func(t *testing.T) {
			want := base.find(t, name)
			variants := want.Variants
			if invariantsBuild {
				if name != "gpt2_train" {
					t.Skip("-tags invariants: gpt2_train only (a replay of gpt2_varlen takes 5 s with -race); the plain run checks every trace")
				}
				variants = variants[:3]
			}
			tr, err := trace.ReadFile(path)
			require.NoError(t, err)
			if raceBuild && !invariantsBuild {
				// The trace itself, and its variant of seed 1 unless the
				// trace is long (generation: half a million events).
				variants = variants[:0]
				if len(tr.Events) < raceVariantEvents {
					variants = want.Variants[:1]
				}
			}
			res := replay(t, d, tr)
			compare(t, tr.Name, res.Ratio, want.Ratio)
			for _, bv := range variants {
				v := replay(t, d, perturb(t, tr, bv.Seed))
				compare(t, v.Trace, v.Ratio, bv.Ratio)
			}
		})
	}
}

// compare fails if got is worse than want, and logs a gain.
func compare(t *testing.T, name string, got, want float64) {
	t.Helper()
	switch {
	case got > want+tolerance:
		t.Errorf("%s: peak reserved / peak live %.5f, worse than the baseline's %.5f (bench/traces/baseline.json).\n"+
			"If the change is worth it, say why in the commit and regenerate the baseline: %s", name, got, want, updateCmd)
	case got < want-tolerance:
		t.Logf("%s: peak reserved / peak live %.5f, better than the baseline's %.5f: regenerate the baseline to keep the gain: %s",
			name, got, want, updateCmd)
	}
}

func readBaseline(t *testing.T) *baseline {
	t.Helper()
	data, err := os.ReadFile(baselinePath)
	require.NoError(t, err, "make it with: %s", updateCmd)
	var b baseline
	require.NoError(t, json.Unmarshal(data, &b))
	require.Equal(t, xseg.BackendHost, b.Backend)
	require.Equal(t, trace.DefaultJitter, b.Jitter, "the baseline was made with another jitter: %s", updateCmd)
	return &b
}

// find returns the baseline of a trace and checks that it is whole.
func (b *baseline) find(t *testing.T, name string) baselineTrace {
	t.Helper()
	i := slices.IndexFunc(b.Traces, func(bt baselineTrace) bool { return bt.Trace == name })
	require.GreaterOrEqual(t, i, 0, "bench/traces/baseline.json has no %s: %s", name, updateCmd)
	bt := b.Traces[i]
	require.Len(t, bt.Variants, baselineSeeds)
	for i, v := range bt.Variants {
		require.Equal(t, uint64(i+1), v.Seed)
	}
	return bt
}

func writeBaseline(t *testing.T, paths []string) {
	b := baseline{
		About:     "peak reserved / peak live of the default configuration on the host backend, for each trace and its variants (seeds 1 to 10); made by: " + updateCmd,
		Backend:   xseg.BackendHost,
		Allocator: string(xseg.AllocatorExpandable),
		Jitter:    trace.DefaultJitter,
	}
	d := hostDriver(t)
	for _, path := range paths {
		tr, err := trace.ReadFile(path)
		require.NoError(t, err)
		res := replay(t, d, tr)
		bt := baselineTrace{Trace: traceName(path), Ratio: res.Ratio, Maps: res.Maps, Unmaps: res.Unmaps}
		var vs []trace.VariantResult
		for seed := uint64(1); seed <= baselineSeeds; seed++ {
			v := replay(t, d, perturb(t, tr, seed))
			vs = append(vs, trace.VariantResult{Seed: seed, Result: v})
			bt.Variants = append(bt.Variants, baselineVariant{Seed: seed, Ratio: v.Ratio, Maps: v.Maps, Unmaps: v.Unmaps})
		}
		s := trace.SpreadOf(vs)
		bt.WorstRatio, bt.WorstSeed = s.Worst, s.WorstSeed
		t.Logf("%s: ratio %.5f, variants best %.5f median %.5f worst %.5f (seed %d)", bt.Trace, bt.Ratio, s.Best, s.Median, s.Worst, s.WorstSeed)
		b.Traces = append(b.Traces, bt)
	}
	data, err := json.MarshalIndent(b, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(baselinePath, append(data, '\n'), 0o644))
	t.Logf("wrote %s", baselinePath)
}

// traceName is a trace file's name without its folder and .trace.gz.
func traceName(path string) string {
	return strings.TrimSuffix(filepath.Base(path), ".trace.gz")
}

func hostDriver(t *testing.T) vmm.Driver {
	t.Helper()
	d, err := xseg.OpenDriver(xseg.BackendHost, host.DefaultCapacity)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

func perturb(t *testing.T, tr *trace.Trace, seed uint64) *trace.Trace {
	t.Helper()
	v, err := trace.Perturb(tr, trace.DefaultPerturbation(seed))
	require.NoError(t, err)
	return v
}

// replay replays tr through a fresh expandable allocator with the default
// configuration (not the environment's) on d, and checks that every
// allocation succeeded and that d holds nothing more afterwards.
func replay(t *testing.T, d vmm.Driver, tr *trace.Trace) trace.Result {
	t.Helper()
	return replayWith(t, d, tr, xseg.DefaultConfig())
}

// replayWith is replay with configuration cfg.
func replayWith(t *testing.T, d vmm.Driver, tr *trace.Trace, cfg xseg.Config) trace.Result {
	t.Helper()
	return replayThrough(t, d, tr, cfg, func(a trace.Allocator) trace.Allocator { return a })
}

// replayThrough is replayWith with the allocator seen by the replay
// wrapped by wrap.
func replayThrough(t *testing.T, d vmm.Driver, tr *trace.Trace, cfg xseg.Config, wrap func(trace.Allocator) trace.Allocator) trace.Result {
	t.Helper()
	before := d.Usage()
	a, err := xseg.Open(xseg.Options{Driver: d, Allocator: xseg.AllocatorExpandable, Config: &cfg})
	require.NoError(t, err)
	streams, destroy, err := trace.OpenStreams(d, 0, tr)
	require.NoError(t, err)
	res, err := trace.Replay(tr, wrap(a), trace.Options{Streams: streams})
	require.NoError(t, errors.Join(err, a.Close(), destroy()))
	require.Zero(t, res.FailedAllocs, "%v", res.FirstFailure)
	require.Equal(t, before, d.Usage(), "%s: the driver holds more after the replay", tr.Name)
	t.Logf("%s: ratio %.5f, %.0f ns/event", tr.Name, res.Ratio, res.NsPerEvent)
	return res
}
