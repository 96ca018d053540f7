package metrics_test

import (
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/metrics"
)

// Register a collector of an allocator's statistics; every scrape reads
// them afresh. A program serves the registry with promhttp.HandlerFor;
// here one metric of the gathered families is printed.
func ExampleNew() {
	cfg := xseg.ClassicConfig()
	a, err := xseg.Open(xseg.Options{Backend: "host", Config: &cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(a, prometheus.Labels{"device": "0"}))

	if _, err := a.Alloc(3<<20, 0); err != nil { // a large-pool block
		log.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "xseg_allocated_bytes" {
			continue
		}
		for _, m := range f.GetMetric() {
			fmt.Print(f.GetName())
			for _, l := range m.GetLabel() {
				fmt.Printf(" %s=%s", l.GetName(), l.GetValue())
			}
			fmt.Printf(" %.0f\n", m.GetGauge().GetValue())
		}
	}
	// Output:
	// xseg_allocated_bytes device=0 pool=large 3145728
	// xseg_allocated_bytes device=0 pool=small 0
}

// Attr puts the statistics on a log line.
func ExampleAttr() {
	cfg := xseg.ClassicConfig()
	a, err := xseg.Open(xseg.Options{Backend: "host", Config: &cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Alloc(4096, 0); err != nil { // a small-pool block
		log.Fatal(err)
	}

	// A text handler without the time, so the output does not change.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	logger.Info("memory", metrics.Attr("xseg", a.Stats()))
	// Output:
	// level=INFO msg=memory xseg.allocated_bytes=4096 xseg.allocated_bytes_peak=4096 xseg.reserved_bytes=2097152 xseg.reserved_bytes_peak=2097152 xseg.allocations=1 xseg.segments=1 xseg.alloc_retries=0 xseg.ooms=0 xseg.maps=1 xseg.unmaps=0
}
