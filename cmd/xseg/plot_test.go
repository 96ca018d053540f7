package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bench/trace"
)

func TestReplayPlot(t *testing.T) {
	a := writeTrace(t, "a.trace.gz", synthetic)
	b := writeTrace(t, "b.trace", synthetic+"f 4\n")
	dir := t.TempDir()

	one := filepath.Join(dir, "one.png")
	_, stderr, err := run(t, "replay", "--backend", "host", "--plot", one, a)
	require.NoError(t, err, stderr)
	requirePNG(t, one)

	two := filepath.Join(dir, "two.png")
	_, stderr, err = run(t, "replay", "--backend", "host", "--plot", two, a, b)
	require.NoError(t, err, stderr)
	requirePNG(t, filepath.Join(dir, "two.a.png"))
	requirePNG(t, filepath.Join(dir, "two.b.png"))
	_, err = os.Stat(two)
	require.ErrorIs(t, err, os.ErrNotExist, "with several traces, only the per-trace files")
}

func requirePNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	require.NoError(t, err)
	require.Equal(t, 864, cfg.Width, "9 inches at 96 dpi")
	require.Equal(t, 432, cfg.Height)
}

// TestPlotSamples checks the points: each the highest of its run of
// events, so the peak of live bytes is on the line.
func TestPlotSamples(t *testing.T) {
	tr, err := trace.Parse("synthetic", strings.NewReader(synthetic))
	require.NoError(t, err)
	a, err := xseg.Open(xseg.Options{Backend: "host", HostCapacity: 1 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	p := newTracePlot("x.png", 1)
	sample, every := p.sampler(tr, a)
	require.Equal(t, 1, every)
	_, err = trace.Replay(tr, a, trace.Options{Sample: sample, SampleEvery: every})
	require.NoError(t, err)
	s := p.series[0]
	require.Len(t, s.live, len(tr.Events), "a point per event for a short trace")
	top := 0.0
	for _, xy := range s.live {
		top = max(top, xy.Y)
	}
	require.InDelta(t, float64(syntheticPeak)/(1<<30), top, 1e-12)
	require.Equal(t, float64(len(tr.Events)), s.live[len(s.live)-1].X)

	require.Nil(t, newTracePlot("", 1))
	var none *tracePlot
	f, n := none.sampler(tr, a)
	require.Nil(t, f)
	require.Zero(t, n)
	require.NoError(t, none.write())
	require.Equal(t, "out.gpt2_train.png", plotPath("out.png", traceName("bench/traces/gpt2_train.trace.gz"), true))
	require.Equal(t, "out.png", plotPath("out.png", "x", false))
}
