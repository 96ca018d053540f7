package main

import (
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dustin/go-humanize"
	"github.com/stretchr/testify/require"
	"gonum.org/v1/plot/plotter"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bench/trace"
	"github.com/xseg-dev/xseg/vmm"
)

func TestReplayPlot(t *testing.T) {
	a := writeTrace(t, "a.trace.gz", synthetic)
	b := writeTrace(t, "b.trace", synthetic+"f 4\n")
	dir := t.TempDir()

	one := filepath.Join(dir, "one.png")
	_, stderr, err := run(t, "replay", "--backend", "host", "--plot", one, a)
	require.NoError(t, err, stderr)
	requirePNG(t, one)
	require.Equal(t, "plot of a written to "+one+"\n", stderr, "it says where it wrote")

	two := filepath.Join(dir, "two.png")
	_, stderr, err = run(t, "replay", "--backend", "host", "--plot", two, a, b)
	require.NoError(t, err, stderr)
	requirePNG(t, filepath.Join(dir, "two.a.png"))
	requirePNG(t, filepath.Join(dir, "two.b.png"))
	require.Equal(t, "plot of a written to "+filepath.Join(dir, "two.a.png")+"\n"+
		"plot of b written to "+filepath.Join(dir, "two.b.png")+"\n", stderr)
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
	p, tr := replayedPlot(t, filepath.Join(t.TempDir(), "x.png"))
	s := p.series[0]
	require.Equal(t, 1, s.every)
	require.Len(t, s.live, len(tr.Events), "a point per event for a short trace")
	top := 0.0
	for _, xy := range s.live {
		top = max(top, xy.Y)
	}
	require.InDelta(t, float64(syntheticPeak)/(1<<30), top, 1e-12)
	require.Equal(t, float64(len(tr.Events)), s.live[len(s.live)-1].X)

	none, err := newTracePlot("", []string{tr.Name})
	require.NoError(t, err)
	require.Nil(t, none)
	f, n := none.sampler(tr, nil)
	require.Nil(t, f)
	require.Zero(t, n)
	none.result(trace.Result{})
	require.NoError(t, none.write(nil))
	require.Equal(t, "out.gpt2_train.png", plotPath("out.png", traceName("bench/traces/gpt2_train.trace.gz"), true))
	require.Equal(t, "out.png", plotPath("out.png", "x", false))
}

// TestPlotPathCheckedFirst: a path the plot cannot be written to fails
// before any trace is read or replayed, and leaves no file behind.
func TestPlotPathCheckedFirst(t *testing.T) {
	dir := t.TempDir()
	// The trace does not exist: an error about it would mean the plot path
	// was checked after the traces were read.
	missing := filepath.Join(dir, "missing.trace")
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "out.gif"), "the extension picks the image format; want one of .eps, .jpeg, .jpg, .pdf, .png, .svg, .tex, .tif, .tiff"},
		{filepath.Join(dir, "out"), "the extension picks the image format"},
		{filepath.Join(dir, "no", "such", "folder", "out.png"), "cannot write to its folder"},
	} {
		out, _, err := run(t, "replay", "--backend", "host", "--plot", c.path, missing)
		require.ErrorContains(t, err, "--plot "+c.path+": "+c.want)
		require.NotContains(t, err.Error(), "missing.trace", "the trace was not read")
		require.Empty(t, out)
	}
	if os.Getuid() != 0 { // root writes anywhere
		ro := filepath.Join(dir, "ro")
		require.NoError(t, os.Mkdir(ro, 0o555))
		_, _, err := run(t, "replay", "--backend", "host", "--plot", filepath.Join(ro, "out.png"), missing)
		require.ErrorContains(t, err, "cannot write to its folder")
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.True(t, e.IsDir(), "left behind: %s", e.Name())
	}
}

// TestPlotTicksAndTitle: every tick of both axes is labelled, sizes with
// their unit, events with thousands separators.
func TestPlotTicksAndTitle(t *testing.T) {
	y := labelAll{format: sizeLabel}
	ticks := y.Ticks(0, 27.5)
	var labels []string
	for _, tk := range ticks {
		require.NotEmpty(t, tk.Label, "tick at %g", tk.Value)
		labels = append(labels, tk.Label)
	}
	require.GreaterOrEqual(t, len(labels), 5, labels)
	require.Contains(t, labels, "10 GiB")
	x := labelAll{format: func(v float64) string { return humanize.Comma(int64(v)) }}
	labels = labels[:0]
	for _, tk := range x.Ticks(0, 8989) {
		labels = append(labels, tk.Label)
	}
	require.GreaterOrEqual(t, len(labels), 5, labels)
	require.Contains(t, labels, "4,000")
}

// TestNiceCeil: the y axis ends at a round size at or above the data, in at
// most six round steps.
func TestNiceCeil(t *testing.T) {
	for v, want := range map[float64]float64{19.16: 20, 3.1: 4, 0.5: 0.5, 100: 100, 0: 1, 7: 8, 31: 40} {
		got := niceCeil(v)
		if got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
	for v := 0.01; v < 5000; v *= 1.37 {
		if got := niceCeil(v); got < v || got > 2.5*v {
			t.Errorf("niceCeil(%v) = %v: below the data or far above it", v, got)
		}
	}
}

// TestPlotTitleOOM: the title gave the ratio of a replay whose allocations
// failed, which the table refuses to print (it flatters the allocator),
// and 0.0000 for a trace without live bytes; it says what the table says.
func TestPlotTitleOOM(t *testing.T) {
	tr := writeTrace(t, "big.trace", "a 1 41943040 0\na 2 62914560 0\nf 1\nf 2\na 3 1024 0\n")
	empty := writeTrace(t, "empty.trace", "")
	out := filepath.Join(t.TempDir(), "out.svg")
	_, _, err := run(t, "replay", "--backend", "host", "--capacity", "64MiB", "--plot", out, tr, empty)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	title := regexp.MustCompile(`peak reserved [^<]*`)
	svg, err := os.ReadFile(filepath.Join(filepath.Dir(out), "out.big.svg"))
	require.NoError(t, err)
	require.Equal(t, "peak reserved 40 MiB / peak live 100 MiB = n/a (OOM)", title.FindString(string(svg)))
	svg, err = os.ReadFile(filepath.Join(filepath.Dir(out), "out.empty.svg"))
	require.NoError(t, err)
	require.Equal(t, "peak reserved 0 B / peak live 0 B = n/a", title.FindString(string(svg)))
}

// TestPlotSameNames: traces whose names are alike (one file name in two
// folders, a.trace and a.trace.gz) were plotted into one file, each over
// the one before, and the command said it wrote both. Each gets a file of
// its own.
func TestPlotSameNames(t *testing.T) {
	a1 := writeTrace(t, "a.trace", synthetic)
	a2 := writeTrace(t, "a.trace", synthetic+"f 4\n")
	a3 := writeTrace(t, "a.trace.gz", synthetic)
	dir := t.TempDir()
	out := filepath.Join(dir, "out.png")
	_, stderr, err := run(t, "replay", "--backend", "host", "--plot", out, a1, a2, a3)
	require.NoError(t, err, stderr)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	require.Len(t, lines, 3, stderr)
	seen := map[string]bool{}
	for _, l := range lines {
		_, path, ok := strings.Cut(l, " written to ")
		require.True(t, ok, l)
		require.False(t, seen[path], "%s written twice: %s", path, stderr)
		seen[path] = true
		requirePNG(t, path)
	}
	require.True(t, seen[filepath.Join(dir, "out.a.png")], stderr)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 3)
}

// replayedPlot is the plot, for path, of a replay of the synthetic trace,
// and the trace.
func replayedPlot(t *testing.T, path string) (*tracePlot, *trace.Trace) {
	t.Helper()
	tr, err := trace.Parse("synthetic", strings.NewReader(synthetic))
	require.NoError(t, err)
	a, err := xseg.Open(xseg.Options{Backend: "host", HostCapacity: 1 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	p, err := newTracePlot(path, []string{tr.Name})
	require.NoError(t, err)
	sample, every := p.sampler(tr, a)
	res, err := trace.Replay(tr, a, trace.Options{Sample: sample, SampleEvery: every})
	require.NoError(t, err)
	p.result(res)
	return p, tr
}

// TestPlotPathThatCannotBeWritten: a --plot path that is a folder, or an
// existing file that may not be written, failed only after the whole
// replay, although the path is documented as checked before it. Each
// final path (one per trace with several traces) is checked first, and
// an existing file is left as it was.
func TestPlotPathThatCannotBeWritten(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.trace") // never read
	folder := filepath.Join(dir, "folder.png")
	require.NoError(t, os.Mkdir(folder, 0o755))
	_, _, err := run(t, "replay", "--backend", "host", "--plot", folder, missing)
	require.EqualError(t, err, "--plot "+folder+": is a directory")

	// With several traces, the second trace's file is the folder.
	require.NoError(t, os.Mkdir(filepath.Join(dir, "out.x-2.png"), 0o755))
	out := filepath.Join(dir, "out.png")
	_, _, err = run(t, "replay", "--backend", "host", "--plot", out, filepath.Join(dir, "a", "x.trace"), missing, filepath.Join(dir, "b", "x.trace"))
	require.EqualError(t, err, "--plot "+filepath.Join(dir, "out.x-2.png")+": is a directory")

	if os.Getuid() != 0 { // root writes any file
		ro := filepath.Join(dir, "ro.png")
		require.NoError(t, os.WriteFile(ro, []byte("mine"), 0o444))
		_, _, err = run(t, "replay", "--backend", "host", "--plot", ro, missing)
		require.ErrorIs(t, err, os.ErrPermission)
		require.ErrorContains(t, err, "--plot "+ro+": ")
		got, err := os.ReadFile(ro)
		require.NoError(t, err)
		require.Equal(t, "mine", string(got))
	}
	// A writable file is accepted and left as it was until the plot is
	// written: here the trace is missing, so it never is.
	mine := filepath.Join(dir, "mine.png")
	require.NoError(t, os.WriteFile(mine, []byte("mine"), 0o644))
	_, _, err = run(t, "replay", "--backend", "host", "--plot", mine, missing)
	require.ErrorContains(t, err, "missing.trace")
	got, err := os.ReadFile(mine)
	require.NoError(t, err)
	require.Equal(t, "mine", string(got))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.Contains(t, []string{"folder.png", "out.x-2.png", "ro.png", "mine.png"}, e.Name(), "left behind")
	}
}

// TestPlotTicksPast16EiB: the y axis of a peak near 2^64 bytes goes past
// 16 EiB, and its labels wrapped (uint64 of a float past 2^64): 14.9,
// 13.04 ... EiB, then "8 EiB" for every tick above 16 EiB.
func TestPlotTicksPast16EiB(t *testing.T) {
	const peak = 1<<64 - 2<<20
	s := &plotSeries{name: "huge", every: 1, last: 2, res: trace.Result{PeakLive: peak, PeakReserved: peak, Ratio: 1},
		live:     plotter.XYs{{X: 1, Y: float64(peak) / gib}, {X: 2, Y: 0}},
		reserved: plotter.XYs{{X: 1, Y: float64(peak) / gib}, {X: 2, Y: 0}}}
	path := filepath.Join(t.TempDir(), "huge.svg")
	require.NoError(t, s.draw(path, "host"))
	svg, err := os.ReadFile(path)
	require.NoError(t, err)
	var eib []float64
	for _, m := range regexp.MustCompile(`>([0-9.]+) EiB<`).FindAllStringSubmatch(string(svg), -1) {
		v, err := strconv.ParseFloat(m[1], 64)
		require.NoError(t, err)
		eib = append(eib, v)
	}
	require.GreaterOrEqual(t, len(eib), 3, string(svg))
	slices.Sort(eib)
	require.Greater(t, eib[len(eib)-1], 16.0, "ticks past 16 EiB: %v", eib)
	require.Equal(t, len(eib), len(slices.Compact(slices.Clone(eib))), "no label twice: %v", eib)
}
