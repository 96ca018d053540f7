package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"

	"github.com/spf13/cobra"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bench/trace"
	"github.com/xseg-dev/xseg/vmm"
)

// replayFlags are the flags of `xseg replay`.
type replayFlags struct {
	backend   *enumFlag[xseg.Backend]
	allocator *enumFlag[xseg.AllocatorKind]
	capacity  capacityFlag
	device    int
	conf      string
	json      bool
	verbose   bool
	plot      string
	perturb   int
	seed      uint64
	jitter    float64
	// writeVariants: with --perturb, the directory each variant is
	// written into as a trace.
	writeVariants string
}

func newReplayCmd(stdout, stderr io.Writer) *cobra.Command {
	f := &replayFlags{
		backend:   newEnum(xseg.BackendAuto, xseg.Backends()...),
		allocator: newEnum(xseg.AllocatorAuto, xseg.AllocatorKinds()...),
		seed:      1,
	}
	cmd := &cobra.Command{
		Use:   "replay [flags] TRACE...",
		Short: "Replay allocation traces and report peak memory and speed",
		Long: `replay reads each TRACE (gzip or plain text, one event a line:
"a <id> <bytes> <stream>" allocates, "f <id>" frees), checks it whole, then
drives a fresh allocator with its events and reports, per trace: events, the
trace's peak of live bytes, the allocator's peak of reserved bytes, their
ratio (peak reserved / peak live: 1.0 wastes nothing), nanoseconds per event,
pages mapped (in all, and "late": over the second half of the events, the
events after the first N/2 of N, N/2 rounded down and at least 1, so that a
trace of one event has none; a loop whose layout has settled maps nothing
late and one that moves pages every step keeps mapping; policy:steady is
for such loops) and unmapped,
allocation retries and out-of-memory errors. The
ratio shows n/a (OOM) for a replay with failed allocations, and n/a for a
trace that never holds a live byte (empty, or 0-byte allocations only;
--json gives ratio 0 there). Sizes are printed in KiB, MiB and GiB; --json
prints them in bytes. Trace stream 0 is the default stream; every other
trace stream gets a stream of its own. Blocks still live at the end are
freed after the timing. It fails if a trace does not parse or an allocation
fails, and before any trace if the configuration (XSEG_CONF in the
environment, --conf) does not parse.

--perturb N also replays N variants of each trace, with seeds --seed to
--seed+N-1, each through a fresh allocator: a long-lived block of 1.5 to
20 MiB allocated first (every address moves), and every distinct size raised
by a fraction drawn in [0, --jitter) once per size (equal sizes stay equal).
A variant's ratio is over its own peak of live bytes, the first block
included. The table then shows each trace's ratio and the best, median and
worst ratio of its variants with the worst one's seed (n/a (OOM) where a
variant's allocations failed, with the first such variant's seed); --json adds the
field "variants", one result (with its "seed") per variant. A policy whose
ratio holds only for the exact trace shows there. --write-variants DIR also
writes each variant into DIR as NAME.seed<S>.trace.gz (never over an
existing file), for another allocator to replay the same variant: NAME is
the trace's file name without its folder, ".gz" and ".trace"; a second
trace of that NAME in the run (a/x.trace and b/x.trace, or x.trace and
x.trace.gz) gets NAME-2.seed<S>.trace.gz, a third NAME-3, and so on.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, paths []string) error {
			// Every error from here on is one line that names its flag
			// or trace; the usage text would bury it (see flagError).
			cmd.SilenceUsage = true
			if err := checkPerturbFlags(cmd, f); err != nil {
				return err
			}
			return runReplay(f, paths, stdout, stderr)
		},
	}
	fl := cmd.Flags()
	fl.Var(f.backend, "backend", "memory backend: auto (CUDA if it opens, else host), host or cuda")
	fl.Var(f.allocator, "allocator", "allocator: auto (expandable where the device supports VMM), expandable or fallback")
	fl.Var(&f.capacity, "capacity", capacityUsage)
	fl.IntVar(&f.device, "device", 0, "`ordinal` of the device to replay on")
	fl.StringVar(&f.conf, "conf", "", "allocator configuration in `XSEG_CONF` syntax (key:value,...), applied over the environment's")
	fl.BoolVar(&f.json, "json", false, "print one JSON object a line per trace")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "log the allocator's informational messages to stderr")
	fl.StringVar(&f.plot, "plot", "", "draw live and reserved bytes over each trace's events into `FILE.png` (or .svg, .pdf, ...; with several traces, FILE.<trace>.png, FILE.<trace>-2.png for a second trace of that name)")
	fl.IntVar(&f.perturb, "perturb", 0, "also replay `N` perturbed variants of each trace and report their worst ratio")
	fl.Var((*seedFlag)(&f.seed), "seed", "with --perturb, the seed `S` of the first variant; the others follow it")
	fl.Float64Var(&f.jitter, "jitter", trace.DefaultJitter, "with --perturb, the largest fraction `F` by which a size is raised")
	fl.StringVar(&f.writeVariants, "write-variants", "", "with --perturb, also write each variant into `DIR` as NAME.seed<S>.trace.gz, NAME-2.seed<S>.trace.gz for a second trace of that name (an existing file is not replaced)")
	return cmd
}

// checkPerturbFlags rejects a negative --perturb, seeds that would pass
// 2^64-1 (--seed + --perturb - 1), a --jitter outside [0, 1], a
// --write-variants that is not a directory, and --seed, --jitter or
// --write-variants without --perturb (they would do nothing).
func checkPerturbFlags(cmd *cobra.Command, f *replayFlags) error {
	if f.perturb < 0 {
		return fmt.Errorf("--perturb %d: want a number of variants, 0 or more", f.perturb)
	}
	if f.perturb > 0 && f.seed > math.MaxUint64-uint64(f.perturb-1) {
		return fmt.Errorf("--seed %d with --perturb %d: the last seed would be %d + %d, past %d",
			f.seed, f.perturb, f.seed, f.perturb-1, uint64(math.MaxUint64))
	}
	if err := f.perturbation(0).Validate(); err != nil {
		return fmt.Errorf("--jitter %v: %w", f.jitter, err)
	}
	if f.writeVariants != "" {
		if st, err := os.Stat(f.writeVariants); err != nil {
			return fmt.Errorf("--write-variants: %w", err)
		} else if !st.IsDir() {
			return fmt.Errorf("--write-variants %s: not a directory", f.writeVariants)
		}
	}
	if f.perturb == 0 {
		for _, name := range []string{"seed", "jitter", "write-variants"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s applies to the variants of --perturb N, and --perturb is 0", name)
			}
		}
	}
	return nil
}

// perturbation is the perturbation of the variant with seed seed.
func (f *replayFlags) perturbation(seed uint64) trace.Perturbation {
	p := trace.DefaultPerturbation(seed)
	p.Jitter = f.jitter
	if p.Jitter == 0 {
		p.Jitter = 0 // --jitter -0: "up to 0 %", not "-0 %"
	}
	return p
}

// runReplay parses every trace, then replays them one by one on one driver.
func runReplay(f *replayFlags, paths []string, stdout, stderr io.Writer) error {
	if f.capacity != 0 && f.backend.value == xseg.BackendCUDA {
		return errors.New("--capacity sets the host backend's memory; it does not apply to --backend cuda")
	}
	cfg, err := replayConfig(f.conf)
	if err != nil {
		return err
	}
	plot, err := newTracePlot(f.plot, paths)
	if err != nil {
		return err
	}
	traces := make([]*trace.Trace, 0, len(paths))
	for _, p := range paths {
		t, err := trace.ReadFile(p)
		if err != nil {
			return err
		}
		traces = append(traces, t)
	}
	d, err := xseg.OpenDriver(f.backend.value, uint64(f.capacity))
	if err != nil {
		return err
	}
	if err := checkDevice(d, f.device); err != nil {
		return errors.Join(err, d.Close())
	}
	r := &replayer{flags: f, d: d, dev: vmm.Device(f.device), cfg: cfg, stderr: stderr, log: newLogger(stderr, f.verbose), plot: plot}
	out := newResultPrinter(stdout, f.json)
	if f.perturb > 0 {
		out.variants = describeVariants(f)
	}
	name := f.allocator.value
	if c, err := xseg.ChooseAllocator(d, vmm.Device(f.device), name); err == nil {
		name = c.Allocator
	}
	if plot != nil {
		plot.setup = fmt.Sprintf("backend %s, allocator %s", d.Backend(), name)
	}
	if !f.json {
		fmt.Fprintf(stdout, "backend %s, allocator %s, device %d\n", d.Backend(), name, f.device)
	}
	var errs []error
	for _, t := range traces {
		res, err := r.replay(t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, failedAllocs(res))
		rep := traceReport{Result: res}
		rep.Variants, err = r.variants(t)
		errs = append(errs, err, out.add(rep))
	}
	errs = append(errs, out.flush(), r.plot.write(stderr), d.Close())
	return errors.Join(errs...)
}

// checkDevice fails, naming the flag, if d has no device ordinal dev.
func checkDevice(d vmm.Driver, dev int) error {
	n, err := d.DeviceCount()
	if err != nil {
		return fmt.Errorf("--device %d: counting the %s backend's devices: %w", dev, d.Backend(), err)
	}
	if dev >= 0 && dev < n {
		return nil
	}
	has := fmt.Sprintf("%d devices, ordinals 0 to %d", n, n-1)
	switch n {
	case 0:
		has = "no devices"
	case 1:
		has = "1 device, ordinal 0"
	}
	return fmt.Errorf("--device %d: the %s backend has %s: %w", dev, d.Backend(), has, vmm.ErrInvalid)
}

// replayConfig is the allocator configuration: the environment's, with
// conf (--conf) over it if not empty. Read once, before any trace, so
// that a bad XSEG_CONF fails up front as a bad --conf does (the error
// names the variable), not at each trace's xseg.Open.
func replayConfig(conf string) (*xseg.Config, error) {
	base, err := xseg.ConfigFromEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	if conf == "" {
		return &base, nil
	}
	cfg, err := xseg.ParseConfig(base, conf)
	if err != nil {
		return nil, fmt.Errorf("--conf: %w", err)
	}
	return &cfg, nil
}

func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// failedAllocs is the error for a replay whose allocations failed, nil
// for one whose did not.
func failedAllocs(res trace.Result) error {
	if res.FailedAllocs == 0 {
		return nil
	}
	what := fmt.Sprintf("%d allocations", res.FailedAllocs)
	if res.FailedAllocs == 1 {
		what = "1 allocation"
	}
	return fmt.Errorf("%s: %s failed, the first: %w", res.Trace, what, res.FirstFailure)
}

// traceReport is what is printed of one trace: its replay's result and,
// with --perturb, its variants'. The JSON of Result is kept, with one key
// more, "variants", with --perturb only.
type traceReport struct {
	trace.Result
	Variants []trace.VariantResult `json:"variants,omitempty"`
}

// resultPrinter prints results as a table (at flush) or as JSON lines (at
// once).
type resultPrinter struct {
	w        io.Writer
	json     *json.Encoder
	result   []traceReport
	variants string // with --perturb, the line above the variants' table
}

func newResultPrinter(w io.Writer, asJSON bool) *resultPrinter {
	p := &resultPrinter{w: w}
	if asJSON {
		p.json = json.NewEncoder(w)
	}
	return p
}

func (p *resultPrinter) add(r traceReport) error {
	if p.json != nil {
		return p.json.Encode(r)
	}
	p.result = append(p.result, r)
	return nil
}
