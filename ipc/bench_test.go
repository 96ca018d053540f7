//go:build linux

package ipc

import (
	"bufio"
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/cuda"
	"github.com/xseg-dev/xseg/vmm/host"
)

// The shape of the benchmark's share: what torch.multiprocessing sends of
// a large tensor under a policy that gives it one physical allocation of
// many pages plus an edge page.
var benchSpans = []int{8, 1}

func init() { allocRoles["export-bench"] = childExportBench }

// childExportBench shares two sealed memfds (benchSpans pages of the host
// backend's granularity) without a limit of importers, prints the
// descriptor and serves until stdin closes.
func childExportBench() error {
	ps := host.DefaultGranularity
	fds := make([]*handles.FD, len(benchSpans))
	total := uint64(0)
	for i, n := range benchSpans {
		var err error
		if fds[i], err = sealedMemfd("xseg-bench", uint64(n)*ps); err != nil {
			return err
		}
		total += uint64(n) * ps
	}
	e, err := NewExporter(ExporterOptions{})
	if err != nil {
		return err
	}
	defer e.Close()
	s, err := e.ShareFDs(fds, Extent{PageSize: ps, Spans: benchSpans, Offset: 4096, Length: total - 8192}, nil)
	if err != nil {
		return err
	}
	return announce(s)
}

// BenchmarkOpenClose is Importer.Open then Mapping.Close of a share of
// two allocations exported by another process (host backend), the
// consumer's side of a torch.multiprocessing message: each Open fetches
// the fds (pidfd, or the socket with -bench transports), takes a lease,
// reserves, imports, maps, sets access; each Close undoes it all. The
// loop runs on a locked OS thread, as a call into libxseg from Python
// does. XSEG_BENCH_EXPORTER_CPUS runs the exporter on those CPUs (taskset
// -c). Besides ns/op it reports the median of the iterations (p50-ns)
// and their 90th percentile (p90-ns), and the medians of Open alone
// (open-p50-ns) and of Close alone (close-p50-ns).
func BenchmarkOpenClose(b *testing.B) {
	for _, tc := range []struct {
		name string
		ts   []Transport
	}{{"auto", nil}, {"socket", []Transport{TransportSocket}}} {
		b.Run(tc.name, func(b *testing.B) { benchOpenClose(b, tc.ts) })
	}
}

func benchOpenClose(b *testing.B, ts []Transport) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	args := []string{exe, "-test.run=^TestHelperChild$", "-test.v=false"}
	if cpus := os.Getenv("XSEG_BENCH_EXPORTER_CPUS"); cpus != "" {
		// Keep the exporter off the importer's CPUs (run the benchmark
		// itself under taskset too): on a machine of few cores the two
		// processes otherwise take turns, and what one overlaps with the
		// other shows as time.
		args = append([]string{"taskset", "-c", cpus}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), envRole+"=export-bench")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("reading the exporter's descriptor: %v", err)
	}
	desc, err := hex.DecodeString(strings.TrimPrefix(strings.TrimSpace(line), "desc="))
	if err != nil {
		b.Fatal(err)
	}
	drv, err := host.Open(host.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer drv.Close()
	im := NewImporter(drv)
	opts := OpenOptions{Fetch: FetchOptions{Transports: ts}}
	var opens, closes []time.Duration
	open := func() {
		t0 := time.Now()
		m, err := im.Open(context.Background(), desc, 0, opts)
		t1 := time.Now()
		if err == nil {
			err = m.Close()
		}
		if err != nil {
			b.Fatal(err)
		}
		opens, closes = append(opens, t1.Sub(t0)), append(closes, time.Since(t1))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for range 20 { // warm up: the driver's books, the exporter's goroutines
		open()
	}
	times := make([]time.Duration, 0, b.N)
	opens, closes = make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		open()
		times = append(times, time.Since(t0))
	}
	b.StopTimer()
	b.ReportMetric(quantile(times, 0.5), "p50-ns")
	b.ReportMetric(quantile(times, 0.9), "p90-ns")
	b.ReportMetric(quantile(opens, 0.5), "open-p50-ns")
	b.ReportMetric(quantile(closes, 0.5), "close-p50-ns")
	if u := drv.Usage(); u != (vmm.Usage{}) {
		b.Fatalf("the driver still holds %+v after every Close", u)
	}
}

// quantile is the q-quantile of ds in ns (ds gets sorted).
func quantile(ds []time.Duration, q float64) float64 {
	slices.Sort(ds)
	return float64(ds[int(float64(len(ds)-1)*q)].Nanoseconds())
}

// BenchmarkShareBlock is the producer's side of a torch.multiprocessing
// message: Exporter.ShareBlock or ShareBlockOnce of a live block of a
// shareable allocator (its allocations' exports kept from the first
// share, as the allocator keeps them), the descriptor marshalled, then the
// share closed, which unpins the block. The host backend and a 16 MiB
// block; with XSEG_BENCH_BACKEND=cuda (on the GPU machine) the CUDA
// backend and a 1 GiB block, as dropin.py sends.
func BenchmarkShareBlock(b *testing.B) {
	var drv vmm.Driver
	var err error
	size := uint64(16 << 20)
	if os.Getenv("XSEG_BENCH_BACKEND") == "cuda" {
		drv, err = cuda.Open()
		size = 1 << 30
	} else {
		drv, err = host.Open(host.Options{})
	}
	if err != nil {
		b.Fatal(err)
	}
	defer drv.Close()
	for _, once := range []bool{false, true} {
		name := map[bool]string{false: "many", true: "once"}[once]
		b.Run(name, func(b *testing.B) {
			cfg := expandable.DefaultConfig()
			cfg.Shareable = true
			a, err := expandable.New(drv, 0, cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			ptr, err := a.Alloc(size, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Free(ptr)
			e, err := NewExporter(ExporterOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			share := e.ShareBlock
			if once {
				share = e.ShareBlockOnce
			}
			for b.Loop() {
				s, err := share(drv, a, ptr)
				if err == nil {
					_, err = s.MarshalBinary()
				}
				if err == nil {
					err = s.Close()
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
