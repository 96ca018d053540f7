package main

import (
	"errors"
	"fmt"
	"image/color"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/xseg-dev/xseg/bench/trace"
)

// plotPoints bounds the points of a plot's lines: each point is the
// highest value of a run of events, so no peak is lost.
const plotPoints = 4000

// tracePlot draws, for `xseg replay --plot FILE.png`, the live and reserved
// bytes over each trace's events. A nil *tracePlot draws nothing.
type tracePlot struct {
	path   string
	multi  bool // several traces: one file each, named after the trace
	series []*plotSeries
}

// plotSeries is one trace's samples.
type plotSeries struct {
	name           string
	every          int // events a point stands for
	last           int // the trace's last event, always a point
	live, reserved plotter.XYs
}

func newTracePlot(path string, traces int) *tracePlot {
	if path == "" {
		return nil
	}
	return &tracePlot{path: path, multi: traces > 1}
}

// sampler returns the trace.Options fields that sample a's live
// (requested) and reserved bytes after every event of t's replay into a
// new series.
func (p *tracePlot) sampler(t *trace.Trace, a trace.Allocator) (func(int), int) {
	if p == nil {
		return nil, 0
	}
	s := &plotSeries{name: traceName(t.Name), every: max((len(t.Events)+plotPoints-1)/plotPoints, 1), last: len(t.Events)}
	p.series = append(p.series, s)
	return s.add(a), 1
}

// add returns the sample function: it keeps the highest live and reserved
// bytes of each run of s.every events as one point.
func (s *plotSeries) add(a trace.Allocator) func(int) {
	const gib = 1 << 30
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

// traceName is a trace's file name without its folder and extensions.
func traceName(path string) string {
	name := filepath.Base(path)
	for _, ext := range []string{".gz", ".trace", ".txt"} {
		name = strings.TrimSuffix(name, ext)
	}
	return name
}

// write draws every series into its file.
func (p *tracePlot) write() error {
	if p == nil {
		return nil
	}
	var errs []error
	for _, s := range p.series {
		path := plotPath(p.path, s.name, p.multi)
		if err := s.draw(path); err != nil {
			errs = append(errs, fmt.Errorf("--plot %s: %w", path, err))
		}
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

// draw saves the two lines as an image; the extension picks the format.
func (s *plotSeries) draw(path string) error {
	p := plot.New()
	p.Title.Text = s.name + ": live and reserved bytes"
	p.X.Label.Text = "event"
	p.Y.Label.Text = "GiB"
	top := 0.0
	for _, xy := range s.reserved {
		top = max(top, xy.Y)
	}
	for _, xy := range s.live {
		top = max(top, xy.Y)
	}
	p.Y.Min, p.Y.Max = 0, top*1.1+1e-9
	p.Add(plotter.NewGrid())
	for _, l := range []struct {
		name string
		xys  plotter.XYs
		rgb  color.RGBA
	}{{"reserved", s.reserved, color.RGBA{R: 214, G: 39, B: 40, A: 255}}, {"live", s.live, color.RGBA{R: 31, G: 119, B: 180, A: 255}}} {
		line, err := plotter.NewLine(l.xys)
		if err != nil {
			return err
		}
		line.Color, line.Width = l.rgb, vg.Points(1.2)
		p.Add(line)
		p.Legend.Add(l.name, line)
	}
	p.Legend.Top, p.Legend.Left = true, true
	return p.Save(9*vg.Inch, 4.5*vg.Inch, path)
}
