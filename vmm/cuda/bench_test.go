//go:build cgo && linux

package cuda

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// The benchmarks time each driver call through the Go methods and the same
// call made from C with no Go in between (timing_cgo.go). Go and C
// iterations alternate, so that both see the same drift of the driver's
// state, after a few untimed warm-up iterations; which of the two goes
// first alternates too, so that a driver whose state flips with every
// page it creates (the 20 MiB pages do) does not hand one side its slow
// phase for the whole run. Per step they report:
//
//   - go-ns, c-ns: the mean time of the Go method and of the C call;
//   - added-ns: go-ns minus c-ns, what the Go layer (books, cgo crossing,
//     context check) adds on average;
//   - added-trim-ns: the same difference of means with the slowest and
//     the fastest 5% of each side's calls left out. The driver now and then
//     takes tens of microseconds longer on one call; a mean of 2000 calls
//     moves by hundreds of nanoseconds with a few of those, on whichever
//     side they fall. The trimmed means do not, and, unlike a median, they
//     stay put when the driver's times have two modes.
//
// Built with -tags xsegtiming, the trampolines also time themselves, and
// the Go figure is split: drv-ns (the driver call itself, as made from Go),
// ctx-ns (the context check around it) and layer-ns (the rest: books, cgo
// crossing, clock reads). ns/op covers everything, both sides.

// warmup is the number of untimed iterations before the timed ones.
const warmup = 20

// steps collects, per step and iteration, the Go and C times and the
// trampolines' own timing.
type steps struct {
	names      []string
	goT, cT    [][]time.Duration
	drv, tramp [][]time.Duration
	timedBuild bool
}

func newSteps(n int, names ...string) *steps {
	s := &steps{names: names}
	for range names {
		s.goT = append(s.goT, make([]time.Duration, 0, n))
		s.cT = append(s.cT, make([]time.Duration, 0, n))
		s.drv = append(s.drv, make([]time.Duration, 0, n))
		s.tramp = append(s.tramp, make([]time.Duration, 0, n))
	}
	return s
}

// stamp is the clock and the trampolines' counters at one point.
type stamp struct {
	t          time.Time
	drv, tramp time.Duration
}

func (d *Driver) stamp() stamp {
	t := time.Now()
	c, tr := d.timed()
	return stamp{t, c, tr}
}

// addGo records the Go time of step k between two stamps.
func (s *steps) addGo(k int, a, b stamp) {
	s.goT[k] = append(s.goT[k], b.t.Sub(a.t))
	s.drv[k] = append(s.drv[k], b.drv-a.drv)
	s.tramp[k] = append(s.tramp[k], b.tramp-a.tramp)
	if b.tramp != 0 {
		s.timedBuild = true
	}
}

func (s *steps) report(b *testing.B) {
	for k, name := range s.names {
		g, c := mean(s.goT[k]), mean(s.cT[k])
		b.ReportMetric(g, "go-ns/"+name)
		b.ReportMetric(c, "c-ns/"+name)
		b.ReportMetric(g-c, "added-ns/"+name)
		b.ReportMetric(trimmedMean(s.goT[k])-trimmedMean(s.cT[k]), "added-trim-ns/"+name)
		if s.timedBuild {
			drv, tr := mean(s.drv[k]), mean(s.tramp[k])
			b.ReportMetric(drv, "drv-ns/"+name)
			b.ReportMetric(tr-drv, "ctx-ns/"+name)
			b.ReportMetric(g-tr, "layer-ns/"+name)
		}
	}
}

func mean(ds []time.Duration) float64 {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return float64(sum.Nanoseconds()) / float64(max(len(ds), 1))
}

// trimmedMean is the mean of ds without its fastest and slowest 5%.
func trimmedMean(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	cut := len(s) / 20
	return mean(s[cut : len(s)-cut])
}

// onThreadWithContext runs the rest of the benchmark with the device's
// primary context current on a locked thread, as on PyTorch's threads, when
// current is set.
func onThreadWithContext(b *testing.B, d *Driver, current bool) {
	if !current {
		return
	}
	runtime.LockOSThread()
	if err := d.setCurrentContext(0); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = d.setCurrentContext(-1)
		runtime.UnlockOSThread()
	})
}

func BenchmarkReserve80GiB(b *testing.B) {
	d := openGPU(b)
	const size = 80 << 30
	s := newSteps(b.N, "reserve", "free")
	var r, f time.Duration
	for i := -warmup; i < b.N; i++ {
		var err error
		raw := func() { r, f, err = d.rawReserve(size, 1) }
		if i%2 != 0 {
			raw()
		}
		t0 := d.stamp()
		p, err1 := d.Reserve(size, 0)
		t1 := d.stamp()
		if err1 != nil {
			b.Fatal(err1)
		}
		err1 = d.Unreserve(p, size)
		t2 := d.stamp()
		if i%2 == 0 {
			raw()
		}
		if err = firstErr(err1, err); err != nil {
			b.Fatal(err)
		}
		if i >= 0 {
			s.addGo(0, t0, t1)
			s.addGo(1, t1, t2)
			s.cT[0], s.cT[1] = append(s.cT[0], r), append(s.cT[1], f)
		}
	}
	s.report(b)
}

func BenchmarkPage(b *testing.B) {
	for _, size := range []uint64{2 << 20, 20 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) { benchPage(b, size, false) })
	}
	b.Run("2MiB-ctx-current", func(b *testing.B) { benchPage(b, 2<<20, true) })
}

func benchPage(b *testing.B, size uint64, current bool) {
	d := openGPU(b)
	onThreadWithContext(b, d, current)
	p, err := d.Reserve(size, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = d.Unreserve(p, size) }()
	rw := vmm.ReadWrite(0)
	s := newSteps(b.N, "create", "map", "access", "unmap", "release")
	var t [6]stamp
	var c [5]time.Duration
	for i := -warmup; i < b.N; i++ {
		var cerr error
		raw := func() { c, cerr = d.rawPage(0, p, size, 1) }
		if i%2 != 0 {
			raw()
		}
		t[0] = d.stamp()
		h, err := d.Create(0, size, vmm.HandleNone)
		t[1] = d.stamp()
		err = firstErr(err, d.Map(p, size, h, 0))
		t[2] = d.stamp()
		err = firstErr(err, d.SetAccess(p, size, rw))
		t[3] = d.stamp()
		err = firstErr(err, d.Unmap(p, size))
		t[4] = d.stamp()
		err = firstErr(err, d.Release(h))
		t[5] = d.stamp()
		if i%2 == 0 {
			raw()
		}
		if err = firstErr(err, cerr); err != nil {
			b.Fatal(err)
		}
		if i < 0 {
			continue
		}
		for k := range s.names {
			s.addGo(k, t[k], t[k+1])
			s.cT[k] = append(s.cT[k], c[k])
		}
	}
	s.report(b)
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// BenchmarkSetAccessRun64 sets access over a run of 64 mapped 2 MiB pages
// in one call, pages that have it already: it times a grant that changes
// nothing. BenchmarkRun64 times the first grant after a map, which costs
// per mapping.
func BenchmarkSetAccessRun64(b *testing.B) {
	d := openGPU(b)
	const pages = 64
	g := d.books.Granularity()
	size := pages * g
	p, err := d.Reserve(size, 0)
	if err != nil {
		b.Fatal(err)
	}
	hs := make([]vmm.Handle, pages)
	for i := range hs {
		if hs[i], err = d.Create(0, g, vmm.HandleNone); err != nil {
			b.Fatal(err)
		}
		if err := d.Map(p.Add(uint64(i)*g), g, hs[i], 0); err != nil {
			b.Fatal(err)
		}
	}
	rw := vmm.ReadWrite(0)
	s := newSteps(b.N, "access64")
	var c time.Duration
	for i := -warmup; i < b.N; i++ {
		var cerr error
		raw := func() { c, cerr = d.rawAccess(0, p, size, 1) }
		if i%2 != 0 {
			raw()
		}
		t0 := d.stamp()
		err := d.SetAccess(p, size, rw)
		t1 := d.stamp()
		if i%2 == 0 {
			raw()
		}
		if err = firstErr(err, cerr); err != nil {
			b.Fatal(err)
		}
		if i >= 0 {
			s.addGo(0, t0, t1)
			s.cT[0] = append(s.cT[0], c)
		}
	}
	s.report(b)
	if err := d.Unmap(p, size); err != nil {
		b.Fatal(err)
	}
	for _, h := range hs {
		if err := d.Release(h); err != nil {
			b.Fatal(err)
		}
	}
	if err := d.Unreserve(p, size); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkEventQuery measures the Go layer's cost on a call whose driver
// cost is small and steady: cuEventQuery of a completed event. The C loop
// runs with the context current; "none" runs the Go calls on a goroutine
// whose threads start without a context, "current" on a locked thread that
// has it (PyTorch's case). "crossing" calls the trampoline alone (no books,
// no checks): the cgo crossing and the context check.
func BenchmarkEventQuery(b *testing.B) {
	for _, name := range []string{"none", "current", "crossing"} {
		b.Run(name, func(b *testing.B) {
			d := openGPU(b)
			onThreadWithContext(b, d, name == "current")
			e, err := d.EventCreate(0)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = d.EventDestroy(e) }()
			ctx := d.devs[0].Load().ctx
			query := func() (bool, error) { return d.EventQuery(e) }
			if name == "crossing" {
				query = func() (bool, error) { return d.sym.eventQuery(ctx, e) }
			}
			for range warmup {
				_, _ = query()
			}
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				if done, err := query(); err != nil || !done {
					b.Fatal(done, err)
				}
			}
			goT := time.Since(t0)
			cT, err := d.rawEventQuery(0, e, b.N)
			if err != nil {
				b.Fatal(err)
			}
			s := newSteps(1, "query")
			s.goT[0] = []time.Duration{goT / time.Duration(b.N)}
			s.cT[0] = []time.Duration{cT / time.Duration(b.N)}
			s.report(b)
		})
	}
}

// BenchmarkRun64 backs 128 MiB of a reservation two ways, as 64 mappings
// of one 2 MiB page each ("pages", what recycling moves) and as one
// mapping of a single 128 MiB allocation ("alloc", a chunk), and times,
// through the Go methods, each step of a cycle: Map (one call a mapping),
// the first SetAccess over the whole run (one call), a second one (a
// grant that changes nothing) and Unmap of the run (one call; the driver
// makes one cuMemUnmap a mapping). It reports the mean microseconds of a
// step for the whole run: the driver's cost of a grant and an unmap
// follows the mappings, not the calls or the bytes.
func BenchmarkRun64(b *testing.B) {
	for _, tc := range []struct {
		name  string
		pages int // of the granularity, per allocation
	}{{"pages", 1}, {"alloc", 64}} {
		b.Run(tc.name, func(b *testing.B) { benchRun64(b, tc.pages) })
	}
}

func benchRun64(b *testing.B, per int) {
	d := openGPU(b)
	g := d.books.Granularity()
	size := 64 * g
	p, err := d.Reserve(size, 0)
	if err != nil {
		b.Fatal(err)
	}
	hs := make([]vmm.Handle, 64/per)
	for i := range hs {
		if hs[i], err = d.Create(0, uint64(per)*g, vmm.HandleNone); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for _, h := range hs {
			_ = d.Release(h)
		}
		_ = d.Unreserve(p, size)
	})
	rw := vmm.ReadWrite(0)
	names := []string{"map", "first-grant", "re-grant", "unmap"}
	sums := make([][]time.Duration, len(names))
	for i := -warmup; i < b.N; i++ {
		var t [5]time.Time
		t[0] = time.Now()
		for j, h := range hs {
			if err := d.Map(p.Add(uint64(j*per)*g), uint64(per)*g, h, 0); err != nil {
				b.Fatal(err)
			}
		}
		t[1] = time.Now()
		err := d.SetAccess(p, size, rw)
		t[2] = time.Now()
		err = firstErr(err, d.SetAccess(p, size, rw))
		t[3] = time.Now()
		err = firstErr(err, d.Unmap(p, size))
		t[4] = time.Now()
		if err != nil {
			b.Fatal(err)
		}
		if i < 0 {
			continue
		}
		for k := range names {
			sums[k] = append(sums[k], t[k+1].Sub(t[k]))
		}
	}
	for k, name := range names {
		b.ReportMetric(mean(sums[k])/1e3, "us/"+name)
	}
}
