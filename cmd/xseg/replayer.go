package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	// variantNames are the NAMEs of --write-variants's files given so
	// far, one per trace.
	variantNames []string
}

// replay runs one trace, plotted if --plot asks.
func (r *replayer) replay(t *trace.Trace) (trace.Result, error) {
	return r.replayOn(t, r.plot)
}

// variants replays the variants of t that --perturb asks for, in the order
// of their seeds, none plotted. It stops at the first variant whose replay
// fails; a variant whose allocations fail is reported with the others and
// its error joined to the one returned.
func (r *replayer) variants(t *trace.Trace) ([]trace.VariantResult, error) {
	var out []trace.VariantResult
	var errs []error
	name := r.variantName(t.Name)
	for i := range r.flags.perturb {
		seed := r.flags.seed + uint64(i)
		v, err := trace.Perturb(t, r.flags.perturbation(seed))
		if err == nil && r.flags.writeVariants != "" {
			if err = trace.WriteFile(filepath.Join(r.flags.writeVariants, variantFile(name, seed)), v); err != nil {
				err = fmt.Errorf("--write-variants: %s: %w", v.Name, err)
			}
		}
		if err != nil {
			return out, errors.Join(append(errs, err)...)
		}
		res, err := r.replayOn(v, nil)
		if err != nil {
			return out, errors.Join(append(errs, err)...)
		}
		out = append(out, trace.VariantResult{Seed: seed, Result: res})
		errs = append(errs, failedAllocs(res))
	}
	return out, errors.Join(errs...)
}

// variantName is the NAME of the files --write-variants writes for the
// variants of the trace at path: its base name without ".gz" and
// ".trace", or with -2, -3, ... after it if an earlier trace of this run
// has that name (a/x.trace and b/x.trace, or x.trace and x.trace.gz), as
// --plot names its files.
func (r *replayer) variantName(path string) string {
	name := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(path), ".gz"), ".trace")
	name = uniqueName(name, func(n string) bool { return slices.Contains(r.variantNames, n) })
	r.variantNames = append(r.variantNames, name)
	return name
}

// variantFile is the file name --write-variants gives the variant of
// seed seed of a trace whose NAME is name (variantName).
func variantFile(name string, seed uint64) string {
	return fmt.Sprintf("%s.seed%d.trace.gz", name, seed)
}

// replayOn runs one trace: streams, a fresh allocator, the timed events
// (sampled into plot if it is not nil), then everything given back. It
// fails if the driver holds more afterwards than before (a leak of the
// allocator).
func (r *replayer) replayOn(t *trace.Trace, plot *tracePlot) (trace.Result, error) {
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
	sample, every := plot.sampler(t, a)
	res, err := trace.Replay(t, a, trace.Options{Streams: streams, Progress: r.progress(t), Sample: sample, SampleEvery: every})
	plot.result(res)
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
	fmt.Fprintf(tw, "%-*s\tevents\tpeak live\tpeak reserved\tpeak reserved / peak live\tns/event\tmaps\tlate maps\tunmaps\tretries\tooms\t\n", width, "trace")
	failed, empty := false, false
	for _, r := range p.result {
		switch {
		case r.OOMs > 0:
			failed = true
		case r.PeakLive == 0:
			empty = true
		}
		if _, ok := firstOOM(r.Variants); ok {
			failed = true
		}
		fmt.Fprintf(tw, "%-*s\t%d\t%s\t%s\t%s\t%.0f\t%d\t%d\t%d\t%d\t%d\t\n",
			width, r.Trace, r.Events, bytesize.FormatFixed(r.PeakLive, 3), bytesize.FormatFixed(r.PeakReserved, 3), ratioCell(r.Result),
			r.NsPerEvent, r.Maps, r.LateMaps, r.Unmaps, r.Retries, r.OOMs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed {
		fmt.Fprintln(p.w, oomCell+": allocations failed, so the allocator never held the trace's peak of live bytes; the ratio would flatter it (--json still gives it)")
	}
	if empty {
		fmt.Fprintln(p.w, "n/a: the trace never holds a live byte, so there is no ratio (--json gives 0)")
	}
	if p.variants == "" {
		return nil
	}
	return p.flushVariants(width)
}

// ratioCell is a result's ratio as the tables print it: n/a (OOM) for a
// replay whose allocations failed (the allocator never held the trace's
// peak, so the ratio would flatter it; --json still gives it), n/a for a
// trace that never holds a live byte (its Ratio, in --json too, is 0),
// where peak reserved / peak live has no value.
func ratioCell(r trace.Result) string {
	switch {
	case r.OOMs > 0:
		return oomCell
	case r.PeakLive == 0:
		return "n/a"
	}
	return fmt.Sprintf("%.4f", r.Ratio)
}

// oomCell stands for the ratio of a replay whose allocations failed.
const oomCell = "n/a (OOM)"

// firstOOM is the seed of the first of vs whose allocations failed.
func firstOOM(vs []trace.VariantResult) (uint64, bool) {
	for _, v := range vs {
		if v.OOMs > 0 {
			return v.Seed, true
		}
	}
	return 0, false
}

// flushVariants prints, for --perturb, each trace's ratio beside the
// spread of its variants' ratios.
func (p *resultPrinter) flushVariants(width int) error {
	fmt.Fprintf(p.w, "\n%s\n", p.variants)
	tw := tabwriter.NewWriter(p.w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\ttrace's ratio\tvariants\tbest\tmedian\tworst\tworst seed\t\n", width, "trace")
	for _, r := range p.result {
		s := trace.SpreadOf(r.Variants)
		if s.Variants == 0 {
			fmt.Fprintf(tw, "%-*s\t%s\t0\t\t\t\t\t\n", width, r.Trace, ratioCell(r.Result))
			continue
		}
		if seed, ok := firstOOM(r.Variants); ok {
			// Their spread would flatter the allocator: the worst seed is
			// the first variant that failed.
			fmt.Fprintf(tw, "%-*s\t%s\t%d\t%s\t%s\t%s\t%d\t\n",
				width, r.Trace, ratioCell(r.Result), s.Variants, oomCell, oomCell, oomCell, seed)
			continue
		}
		fmt.Fprintf(tw, "%-*s\t%s\t%d\t%.4f\t%.4f\t%.4f\t%d\t\n",
			width, r.Trace, ratioCell(r.Result), s.Variants, s.Best, s.Median, s.Worst, s.WorstSeed)
	}
	return tw.Flush()
}

// describeVariants is the line above the variants' table: what was
// perturbed, and how to replay the worst variant alone.
func describeVariants(f *replayFlags) string {
	p := f.perturbation(f.seed)
	return fmt.Sprintf("peak reserved / peak live of %d variants a trace, seeds %d to %d: a first block of %s to %s live to the end, "+
		"every distinct size raised by up to %g %% (--perturb 1 --seed S replays seed S alone)",
		f.perturb, f.seed, f.seed+uint64(f.perturb)-1, bytesize.Format(p.ShiftMin), bytesize.Format(p.ShiftMax), 100*p.Jitter)
}
