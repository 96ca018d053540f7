//go:build cgo && linux

package cuda

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// The benchmarks time each driver call through the Go methods and the same
// call made from C with no Go in between (timing_cgo.go), and report both
// per call, with the difference: what the Go layer (books, cgo crossing,
// context check) adds. Go and C iterations alternate, so that both see the
// same drift of the driver's state. ns/op covers both.

// report adds the Go and C figures of one step.
func report(b *testing.B, step string, goT, cT time.Duration) {
	n := float64(b.N)
	g, c := float64(goT.Nanoseconds())/n, float64(cT.Nanoseconds())/n
	b.ReportMetric(g, "go-ns/"+step)
	b.ReportMetric(c, "c-ns/"+step)
	b.ReportMetric(g-c, "added-ns/"+step)
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
	var res, free, cRes, cFree time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		p, err := d.Reserve(size, 0)
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		err = d.Unreserve(p, size)
		free += time.Since(t1)
		res += t1.Sub(t0)
		if err != nil {
			b.Fatal(err)
		}
		r, f, err := d.rawReserve(size, 1)
		if err != nil {
			b.Fatal(err)
		}
		cRes, cFree = cRes+r, cFree+f
	}
	report(b, "reserve", res, cRes)
	report(b, "free", free, cFree)
}

func BenchmarkPage(b *testing.B) {
	for _, size := range []uint64{2 << 20, 20 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) { benchPage(b, size, false) })
	}
	b.Run("2MiB-ctx-current", func(b *testing.B) { benchPage(b, 2<<20, true) })
}

var pageSteps = [5]string{"create", "map", "access", "unmap", "release"}

func benchPage(b *testing.B, size uint64, current bool) {
	d := openGPU(b)
	onThreadWithContext(b, d, current)
	p, err := d.Reserve(size, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = d.Unreserve(p, size) }()
	rw := vmm.ReadWrite(0)
	var goT, cT [5]time.Duration
	var t [6]time.Time
	for i := 0; i < b.N; i++ {
		t[0] = time.Now()
		h, err := d.Create(0, size, vmm.HandleNone)
		t[1] = time.Now()
		err = firstErr(err, d.Map(p, size, h, 0))
		t[2] = time.Now()
		err = firstErr(err, d.SetAccess(p, size, rw))
		t[3] = time.Now()
		err = firstErr(err, d.Unmap(p, size))
		t[4] = time.Now()
		err = firstErr(err, d.Release(h))
		t[5] = time.Now()
		if err != nil {
			b.Fatal(err)
		}
		c, err := d.rawPage(0, p, size, 1)
		if err != nil {
			b.Fatal(err)
		}
		for k := range goT {
			goT[k] += t[k+1].Sub(t[k])
			cT[k] += c[k]
		}
	}
	for k, step := range pageSteps {
		report(b, step, goT[k], cT[k])
	}
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// BenchmarkSetAccessRun64 sets access over a run of 64 mapped 2 MiB pages
// in one call.
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
	var goT, cT time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		err := d.SetAccess(p, size, rw)
		goT += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		c, err := d.rawAccess(0, p, size, 1)
		if err != nil {
			b.Fatal(err)
		}
		cT += c
	}
	report(b, "access64", goT, cT)
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
// runs with the context current; "none" runs the Go calls on a thread
// without a context (each pushes and pops it), "current" on one that has
// it (PyTorch's case).
func BenchmarkEventQuery(b *testing.B) {
	for _, current := range []bool{false, true} {
		name := "none"
		if current {
			name = "current"
		}
		b.Run(name, func(b *testing.B) {
			d := openGPU(b)
			onThreadWithContext(b, d, current)
			e, err := d.EventCreate(0)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = d.EventDestroy(e) }()
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				if done, err := d.EventQuery(e); err != nil || !done {
					b.Fatal(done, err)
				}
			}
			goT := time.Since(t0)
			cT, err := d.rawEventQuery(0, e, b.N)
			if err != nil {
				b.Fatal(err)
			}
			report(b, "query", goT, cT)
		})
	}
}
