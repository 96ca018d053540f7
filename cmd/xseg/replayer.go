package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"

	"golang.org/x/term"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bench/trace"
	"github.com/xseg-dev/xseg/bytesize"
	"github.com/xseg-dev/xseg/vmm"
)

// replayer replays traces, each through a fresh allocator on one driver.
type replayer struct {
	flags  *replayFlags
	d      vmm.Driver
	dev    vmm.Device
	cfg    *xseg.Config
	stderr io.Writer
	log    *slog.Logger
	plot   *tracePlot // nil without --plot
}

// replay runs one trace: streams, a fresh allocator, the timed events, then
// everything given back. It fails if the driver holds more afterwards than
// before (a leak of the allocator).
func (r *replayer) replay(t *trace.Trace) (trace.Result, error) {
	before := r.d.Usage()
	streams, destroy, err := trace.OpenStreams(r.d, r.dev, t)
	if err != nil {
		return trace.Result{}, fmt.Errorf("%s: %w", t.Name, err)
	}
	a, err := xseg.Open(xseg.Options{
		Driver:    r.d,
		Device:    r.dev,
		Allocator: r.flags.allocator.value,
		Config:    r.cfg,
		Logger:    r.log,
	})
	if err != nil {
		return trace.Result{}, errors.Join(fmt.Errorf("%s: opening the allocator: %w", t.Name, bare(err)), destroy())
	}
	sample, every := r.plot.sampler(t, a)
	res, err := trace.Replay(t, a, trace.Options{Streams: streams, Progress: r.progress(t), Sample: sample, SampleEvery: every})
	r.plot.result(res)
	errs := []error{err}
	if err := a.Close(); err != nil {
		errs = append(errs, fmt.Errorf("%s: closing the allocator: %w", t.Name, err))
	}
	errs = append(errs, destroy())
	if after := r.d.Usage(); after != before {
		errs = append(errs, fmt.Errorf("%s: the driver holds %v after the replay, %v before", t.Name, after, before))
	}
	return res, errors.Join(errs...)
}

// progress returns the progress callback for t: a line on stderr, updated
// in place, for traces long enough to need one and only when stderr is a
// terminal.
func (r *replayer) progress(t *trace.Trace) func(int) {
	f, ok := r.stderr.(*os.File)
	if !ok || len(t.Events) <= trace.ProgressEvery || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return func(done int) {
		if done == len(t.Events) {
			fmt.Fprint(f, "\r\033[K")
			return
		}
		fmt.Fprintf(f, "\r%s: %d/%d events", t.Name, done, len(t.Events))
	}
}

// flush prints the table of the results added, if any: sizes with binary
// units, the ratio under its definition.
func (p *resultPrinter) flush() error {
	if p.json != nil || len(p.result) == 0 {
		return nil
	}
	// Numbers align right; the trace names, padded to one width, left.
	width := len("trace")
	for _, r := range p.result {
		width = max(width, len(r.Trace))
	}
	tw := tabwriter.NewWriter(p.w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tevents\tpeak live\tpeak reserved\tpeak reserved / peak live\tns/event\tmaps\tunmaps\tretries\tooms\t\n", width, "trace")
	for _, r := range p.result {
		fmt.Fprintf(tw, "%-*s\t%d\t%s\t%s\t%.4f\t%.0f\t%d\t%d\t%d\t%d\t\n",
			width, r.Trace, r.Events, bytesize.Format(r.PeakLive), bytesize.Format(r.PeakReserved), r.Ratio,
			r.NsPerEvent, r.Maps, r.Unmaps, r.Retries, r.OOMs)
	}
	return tw.Flush()
}
