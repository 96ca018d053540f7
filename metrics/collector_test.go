package metrics

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm/host"
)

// fixed is a Source with set statistics.
type fixed spec.Stats

func (f *fixed) Stats() spec.Stats { return spec.Stats(*f) }

func sample() *fixed {
	var st spec.Stats
	st.ReservedBytes.Add(spec.Small, 2<<20)
	st.ReservedBytes.Add(spec.Large, 40<<20)
	st.ReservedBytes.Add(spec.Large, -20<<20)
	st.AllocatedBytes.Add(spec.Small, 512)
	st.Allocations.Add(spec.Small, 1)
	st.Allocations.Add(spec.Large, 3)
	st.Allocations.Add(spec.Large, -1)
	st.NumAllocRetries, st.NumOOMs, st.Maps, st.Unmaps = 2, 1, 21, 10
	st.SyncNanos, st.PageNanos = 1_500_000_000, 250_000
	f := fixed(st)
	return &f
}

func TestCollectorValues(t *testing.T) {
	c := New(sample(), prometheus.Labels{"device": "0"})
	want := `
# HELP xseg_reserved_bytes Bytes of device memory the allocator holds: mapped pages and cached ones.
# TYPE xseg_reserved_bytes gauge
xseg_reserved_bytes{device="0",pool="large"} 2.097152e+07
xseg_reserved_bytes{device="0",pool="small"} 2.097152e+06
# HELP xseg_reserved_bytes_peak Peak of xseg_reserved_bytes since the allocator opened or its peaks were reset.
# TYPE xseg_reserved_bytes_peak gauge
xseg_reserved_bytes_peak{device="0",pool="all"} 4.4040192e+07
xseg_reserved_bytes_peak{device="0",pool="large"} 4.194304e+07
xseg_reserved_bytes_peak{device="0",pool="small"} 2.097152e+06
# HELP xseg_allocations_made_total Blocks ever handed out.
# TYPE xseg_allocations_made_total counter
xseg_allocations_made_total{device="0",pool="large"} 3
xseg_allocations_made_total{device="0",pool="small"} 1
# HELP xseg_allocations Blocks handed out now.
# TYPE xseg_allocations gauge
xseg_allocations{device="0",pool="large"} 2
xseg_allocations{device="0",pool="small"} 1
# HELP xseg_alloc_retries_total Allocations retried after the OOM policy freed cached memory.
# TYPE xseg_alloc_retries_total counter
xseg_alloc_retries_total{device="0"} 2
# HELP xseg_ooms_total Out-of-memory errors returned to callers.
# TYPE xseg_ooms_total counter
xseg_ooms_total{device="0"} 1
# HELP xseg_maps_total Physical pages mapped.
# TYPE xseg_maps_total counter
xseg_maps_total{device="0"} 21
# HELP xseg_sync_seconds_total Time spent in the waits syncs_total counts.
# TYPE xseg_sync_seconds_total counter
xseg_sync_seconds_total{device="0"} 1.5
# HELP xseg_page_seconds_total Time spent making pages usable and giving them back.
# TYPE xseg_page_seconds_total counter
xseg_page_seconds_total{device="0"} 0.00025
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"xseg_reserved_bytes", "xseg_reserved_bytes_peak", "xseg_allocations_made_total", "xseg_allocations",
		"xseg_alloc_retries_total", "xseg_ooms_total", "xseg_maps_total", "xseg_sync_seconds_total", "xseg_page_seconds_total"))
	// 7 pool metrics x 5 series, 11 counters of which one has 2 series.
	require.Equal(t, 7*5+10+2, testutil.CollectAndCount(c))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	require.Empty(t, problems, "names follow the Prometheus conventions")
	require.NoError(t, prometheus.NewPedanticRegistry().Register(c), "descriptions are consistent")
}

// TestCollectorAllocator scrapes a live allocator, before and after an
// allocation.
func TestCollectorAllocator(t *testing.T) {
	d, err := host.Open(host.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	a, err := expandable.New(d, 0, expandable.ClassicConfig(), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(New(a, prometheus.Labels{"device": "0", "backend": d.Backend()}))
	count := func(name string) float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		var sum float64
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		return sum
	}
	require.Zero(t, count("xseg_reserved_bytes"))
	p, err := a.Alloc(3<<20, 0)
	require.NoError(t, err)
	require.Equal(t, float64(3<<20), count("xseg_allocated_bytes"))
	require.Equal(t, float64(20<<20), count("xseg_reserved_bytes"), "one 20 MiB large page")
	require.Equal(t, float64(1), count("xseg_maps_total"))
	require.NoError(t, a.Free(p))
	require.Zero(t, count("xseg_allocated_bytes"))
	require.Equal(t, float64(1), count("xseg_allocations_made_total"))
}

func TestAttr(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	log.Info("memory", Attr("xseg", sample().Stats()))
	require.Equal(t, "level=INFO msg=memory xseg.allocated_bytes=512 xseg.allocated_bytes_peak=512 xseg.reserved_bytes=23068672 "+
		"xseg.reserved_bytes_peak=44040192 xseg.allocations=3 xseg.segments=0 xseg.alloc_retries=2 xseg.ooms=1 xseg.maps=21 xseg.unmaps=10\n", buf.String())
}

// TestCollectorOpenMetrics: in OpenMetrics, where a counter's family is
// its name less _total, every metric is still a family of its own. The
// counter of blocks ever handed out was xseg_allocations_total, whose
// family there was the gauge xseg_allocations': a second TYPE line for
// one name, which fails the scrape of a server that serves OpenMetrics.
func TestCollectorOpenMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(New(sample(), prometheus.Labels{"device": "0"}))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var buf bytes.Buffer
	for _, mf := range mfs {
		_, err := expfmt.MetricFamilyToOpenMetrics(&buf, mf)
		require.NoError(t, err)
	}
	_, err = expfmt.FinalizeOpenMetrics(&buf)
	require.NoError(t, err)
	types := make(map[string]string)
	for line := range strings.Lines(buf.String()) {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		require.NotContains(t, types, f[2], "family %s is a %s and a %s", f[2], types[f[2]], f[3])
		types[f[2]] = f[3]
	}
	require.Len(t, types, len(mfs), "one family a metric")
}
