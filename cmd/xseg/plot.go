package main

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/xseg-dev/xseg/bench/trace"
	"github.com/xseg-dev/xseg/bytesize"
)

// plotPoints bounds the points of a plot's lines: each point is the
// highest value of a run of events, so no peak is lost.
const plotPoints = 4000

// eventAxis names the x axis: an event is one line of the trace.
const eventAxis = "event (an allocation or a free, in trace order)"

// tracePlot draws, for `xseg replay --plot FILE.png`, the live and reserved
// bytes over each trace's events, drawn with gonum.org/v1/plot. A nil
// *tracePlot draws nothing.
type tracePlot struct {
	path   string
	multi  bool   // several traces: one file each, named after the trace
	setup  string // backend and allocator, for the titles
	series []*plotSeries
}

// plotSeries is one trace's samples and, once replayed, its result.
type plotSeries struct {
	name           string
	every          int // events a point stands for
	last           int // the trace's last event, always a point
	live, reserved plotter.XYs
	res            trace.Result
}

// newTracePlot checks path before any replay, for a plot of each of
// traces (their paths): an extension the plot library can write, a folder
// where a file can be created, and no file it will write that is a
// folder or may not be written (checkPlotFile). It returns nil for no
// path.
func newTracePlot(path string, traces []string) (*tracePlot, error) {
	if path == "" {
		return nil, nil
	}
	ext := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	formats := draw.Formats()
	slices.Sort(formats)
	if !slices.Contains(formats, ext) {
		return nil, fmt.Errorf("--plot %s: the extension picks the image format; want one of .%s", path, strings.Join(formats, ", ."))
	}
	probe, err := os.CreateTemp(filepath.Dir(path), ".xseg-plot-*")
	if err != nil {
		return nil, fmt.Errorf("--plot %s: cannot write to its folder: %w", path, err)
	}
	errs := errors.Join(probe.Close(), os.Remove(probe.Name()))
	if errs != nil {
		return nil, fmt.Errorf("--plot %s: %w", path, errs)
	}
	p := &tracePlot{path: path, multi: len(traces) > 1}
	// The files the plots will have, named as sampler names them (a trace
	// that fails before its plot is sampled only frees a name).
	var names []string
	for _, tr := range traces {
		name := uniqueName(traceName(tr), func(n string) bool { return slices.Contains(names, n) })
		names = append(names, name)
		file := plotPath(path, name, p.multi)
		if err := checkPlotFile(file); err != nil {
			return nil, fmt.Errorf("--plot %s: %w", file, err)
		}
	}
	return p, nil
}

// checkPlotFile fails if a plot cannot be written to path, which may not
// exist: a folder, something other than a regular file, or a file that
// may not be written (opened for writing, and left as it was, to know).
func checkPlotFile(path string) error {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil // its folder is checked
	case err != nil:
		return err
	case st.IsDir():
		return errors.New("is a directory")
	case !st.Mode().IsRegular():
		return errors.New("not a regular file")
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// sampler returns the trace.Options fields that sample a's live
// (requested) and reserved bytes after every event of t's replay into a
// new series.
func (p *tracePlot) sampler(t *trace.Trace, a trace.Allocator) (func(int), int) {
	if p == nil {
		return nil, 0
	}
	taken := func(n string) bool {
		return slices.ContainsFunc(p.series, func(s *plotSeries) bool { return s.name == n })
	}
	s := &plotSeries{name: uniqueName(traceName(t.Name), taken), every: max((len(t.Events)+plotPoints-1)/plotPoints, 1), last: len(t.Events)}
	p.series = append(p.series, s)
	return s.add(a), 1
}

// uniqueName is name, or name-2, name-3, ... if name is taken already:
// traces of one file name in two folders (or a.trace and a.trace.gz) get
// a plot file each, and --write-variants files of their own.
func uniqueName(name string, taken func(string) bool) string {
	unique := name
	for i := 2; taken(unique); i++ {
		unique = fmt.Sprintf("%s-%d", name, i)
	}
	return unique
}

// result records the result of the trace last sampled, for its title and
// peak lines.
func (p *tracePlot) result(res trace.Result) {
	if p != nil && len(p.series) > 0 {
		p.series[len(p.series)-1].res = res
	}
}

// add returns the sample function: it keeps the highest live and reserved
// bytes of each run of s.every events as one point.
func (s *plotSeries) add(a trace.Allocator) func(int) {
	var live, reserved int64
	return func(done int) {
		st := a.Stats()
		live, reserved = max(live, st.RequestedBytes.All.Current), max(reserved, st.ReservedBytes.All.Current)
		if done%s.every != 0 && done != s.last {
			return
		}
		s.live = append(s.live, plotter.XY{X: float64(done), Y: float64(live) / gib})
		s.reserved = append(s.reserved, plotter.XY{X: float64(done), Y: float64(reserved) / gib})
		live, reserved = 0, 0
	}
}

// gib is the unit of the plots' y values.
const gib = 1 << 30

// traceName is a trace's file name without its folder and extensions.
func traceName(path string) string {
	name := filepath.Base(path)
	for _, ext := range []string{".gz", ".trace", ".txt"} {
		name = strings.TrimSuffix(name, ext)
	}
	return name
}

// write draws every series into its file and says on w where.
func (p *tracePlot) write(w io.Writer) error {
	if p == nil {
		return nil
	}
	var errs []error
	for _, s := range p.series {
		path := plotPath(p.path, s.name, p.multi)
		if err := s.draw(path, p.setup); err != nil {
			errs = append(errs, fmt.Errorf("--plot %s: %w", path, err))
			continue
		}
		fmt.Fprintf(w, "plot of %s written to %s\n", s.name, path)
	}
	return errors.Join(errs...)
}

// plotPath is path, or with several traces path with the trace's name
// inserted before the extension (out.png -> out.gpt2_train.png).
func plotPath(path, name string, multi bool) string {
	if !multi {
		return path
	}
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "." + name + ext
}

var (
	reservedColor = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	liveColor     = color.RGBA{R: 31, G: 119, B: 180, A: 255}
)

// draw saves the two lines, with the two peaks marked and their ratio in
// the title, as an image; the extension picks the format.
func (s *plotSeries) draw(path, setup string) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: live and reserved bytes (%s)\npeak reserved %s / peak live %s = %s",
		s.name, setup, bytesize.Format(s.res.PeakReserved), bytesize.Format(s.res.PeakLive), ratioCell(s.res))
	p.X.Label.Text = eventAxis
	p.Y.Label.Text = "bytes"
	p.X.Tick.Marker = labelAll{format: func(v float64) string { return humanize.Comma(int64(v)) }}
	p.Y.Tick.Marker = labelAll{format: sizeLabel}
	top := max(float64(s.res.PeakReserved), float64(s.res.PeakLive)) / gib
	for _, l := range [][]plotter.XY{s.live, s.reserved} {
		for _, xy := range l {
			top = max(top, xy.Y)
		}
	}
	p.Y.Min, p.Y.Max = 0, niceCeil(top*1.3+1e-9) // room above the peaks for the legend
	p.X.Min, p.X.Max = 0, max(float64(s.last), 1)
	p.Add(plotter.NewGrid())
	for _, l := range []struct {
		name string
		xys  plotter.XYs
		peak uint64
		rgb  color.RGBA
	}{
		{"reserved (peak " + bytesize.Format(s.res.PeakReserved) + ")", s.reserved, s.res.PeakReserved, reservedColor},
		{"live (peak " + bytesize.Format(s.res.PeakLive) + ")", s.live, s.res.PeakLive, liveColor},
	} {
		line, err := plotter.NewLine(l.xys)
		if err != nil {
			return err
		}
		line.Color, line.Width = l.rgb, vg.Points(1.2)
		p.Add(line)
		p.Legend.Add(l.name, line)
		// The peak as a dashed line across the plot.
		peak, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: float64(l.peak) / gib}, {X: p.X.Max, Y: float64(l.peak) / gib}})
		if err != nil {
			return err
		}
		peak.Color, peak.Width, peak.Dashes = l.rgb, vg.Points(0.6), []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(peak)
	}
	p.Legend.Top, p.Legend.Left = true, true
	return save(p, path)
}

// sizeLabel is the label of the y axis's tick at v GiB, as
// bytesize.Format writes sizes; in EiB from 16 EiB on, where the axis
// goes above a peak near 2^64 bytes and no uint64 holds the size.
func sizeLabel(v float64) string {
	if b := v * gib; b < 1<<64 {
		return bytesize.Format(uint64(max(b, 0)))
	}
	return strconv.FormatFloat(v/(1<<30), 'g', 4, 64) + " EiB"
}

// save writes p as an image at path (its extension picks the format)
// through a temporary file in path's folder, renamed over path once
// whole: a failed write (a full disk) leaves no partial image, and a plot
// already at path is kept until the new one replaces it, with its mode
// (0644 for a new file). An existing link is followed: its target is
// replaced.
func save(p *plot.Plot, path string) error {
	if err := checkPlotFile(path); err != nil {
		return err
	}
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	}
	w, err := p.WriterTo(9*vg.Inch, 4.5*vg.Inch, strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), "."))
	if err != nil {
		return err
	}
	mode := fs.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".xseg-plot-*")
	if err != nil {
		return err
	}
	_, err = w.WriteTo(tmp)
	err = errors.Join(err, tmp.Chmod(mode), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	return nil
}

// niceCeil rounds v (GiB) up to a multiple of a step of 1, 2 or 5 times a
// power of ten, chosen so that the axis has at most six steps: gonum's
// ticks then fall on round sizes.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	for p := math.Pow(10, math.Floor(math.Log10(v/6))); ; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if step := m * p; math.Ceil(v/step) <= 6 {
				return math.Ceil(v/step) * step
			}
		}
	}
}

// labelAll is a tick marker that labels every tick gonum's default marker
// places, labelled or not (it labels only two or three), with format.
type labelAll struct{ format func(float64) string }

func (l labelAll) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		ticks[i].Label = l.format(ticks[i].Value)
	}
	return ticks
}
