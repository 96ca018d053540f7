package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xseg-dev/xseg/spec"
)

// Source is what a Collector reads: xseg.Allocator and the allocators of
// packages expandable and fallback satisfy it.
type Source interface {
	Stats() spec.Stats
}

// Collector is a prometheus.Collector over one Source. It is safe for
// concurrent use if the source's Stats is.
type Collector struct {
	src      Source
	pools    []poolMetric
	counters []counterMetric
}

var _ prometheus.Collector = (*Collector)(nil)

// poolMetric is one per-pool counter of spec.Stats, exported as a gauge
// of its current value and a gauge of its peak.
type poolMetric struct {
	cur, peak *prometheus.Desc
	get       func(*spec.Stats) *spec.PoolStat
}

// counterMetric is one monotonic count of spec.Stats.
type counterMetric struct {
	desc *prometheus.Desc
	get  func(*spec.Stats) float64
	// pool, if set, makes the counter per pool from a PoolStat's Allocated.
	pool func(*spec.Stats) *spec.PoolStat
}

// New makes a Collector of src's statistics. constLabels (e.g.
// {"device": "0"}) go on every series; nil for none.
func New(src Source, constLabels prometheus.Labels) *Collector {
	c := &Collector{src: src}
	pool := []string{"pool"}
	gauge := func(name, help string, get func(*spec.Stats) *spec.PoolStat) {
		c.pools = append(c.pools, poolMetric{
			cur:  prometheus.NewDesc("xseg_"+name, help, pool, constLabels),
			peak: prometheus.NewDesc("xseg_"+name+"_peak", "Peak of xseg_"+name+" since the allocator opened or its peaks were reset.", pool, constLabels),
			get:  get,
		})
	}
	gauge("allocated_bytes", "Bytes of blocks handed out to callers (rounded sizes).", func(s *spec.Stats) *spec.PoolStat { return &s.AllocatedBytes })
	gauge("reserved_bytes", "Bytes of device memory the allocator holds: mapped pages and cached ones.", func(s *spec.Stats) *spec.PoolStat { return &s.ReservedBytes })
	gauge("active_bytes", "Allocated bytes plus freed blocks still waiting for stream work before reuse.", func(s *spec.Stats) *spec.PoolStat { return &s.ActiveBytes })
	gauge("requested_bytes", "Bytes callers asked for, before rounding.", func(s *spec.Stats) *spec.PoolStat { return &s.RequestedBytes })
	gauge("allocations", "Blocks handed out now.", func(s *spec.Stats) *spec.PoolStat { return &s.Allocations })
	gauge("active_blocks", "Active blocks now.", func(s *spec.Stats) *spec.PoolStat { return &s.ActiveBlocks })
	gauge("segments", "Segments now.", func(s *spec.Stats) *spec.PoolStat { return &s.Segments })

	counter := func(name, help string, get func(*spec.Stats) int64) {
		c.counters = append(c.counters, counterMetric{
			desc: prometheus.NewDesc("xseg_"+name, help, nil, constLabels),
			get:  func(s *spec.Stats) float64 { return float64(get(s)) },
		})
	}
	c.counters = append(c.counters, counterMetric{
		// Not xseg_allocations_total: OpenMetrics names a counter's family
		// without _total, which would be the gauge xseg_allocations'.
		desc: prometheus.NewDesc("xseg_allocations_made_total", "Blocks ever handed out.", pool, constLabels),
		pool: func(s *spec.Stats) *spec.PoolStat { return &s.Allocations },
	})
	counter("alloc_retries_total", "Allocations retried after the OOM policy freed cached memory.", func(s *spec.Stats) int64 { return s.NumAllocRetries })
	counter("ooms_total", "Out-of-memory errors returned to callers.", func(s *spec.Stats) int64 { return s.NumOOMs })
	counter("maps_total", "Physical pages mapped.", func(s *spec.Stats) int64 { return s.Maps })
	counter("unmaps_total", "Physical pages unmapped.", func(s *spec.Stats) int64 { return s.Unmaps })
	counter("set_access_calls_total", "Set-access driver calls (one per run of pages).", func(s *spec.Stats) int64 { return s.SetAccessCalls })
	counter("syncs_total", "Waits on events or streams.", func(s *spec.Stats) int64 { return s.Syncs })
	counter("pages_created_total", "Physical pages created with the driver.", func(s *spec.Stats) int64 { return s.PagesCreated })
	counter("pages_reused_total", "Physical pages taken from the released-page cache.", func(s *spec.Stats) int64 { return s.PagesReused })
	seconds := func(name, help string, ns func(*spec.Stats) int64) {
		c.counters = append(c.counters, counterMetric{
			desc: prometheus.NewDesc("xseg_"+name, help, nil, constLabels),
			get:  func(s *spec.Stats) float64 { return float64(ns(s)) / 1e9 },
		})
	}
	seconds("sync_seconds_total", "Time spent in the waits syncs_total counts.", func(s *spec.Stats) int64 { return s.SyncNanos })
	seconds("page_seconds_total", "Time spent making pages usable and giving them back.", func(s *spec.Stats) int64 { return s.PageNanos })
	return c
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.pools {
		ch <- m.cur
		ch <- m.peak
	}
	for _, m := range c.counters {
		ch <- m.desc
	}
}

// Collect reads the source's statistics once and sends every metric.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Stats()
	for _, m := range c.pools {
		ps := m.get(&st)
		for _, p := range spec.Pools() {
			ch <- prometheus.MustNewConstMetric(m.cur, prometheus.GaugeValue, float64(ps.Of(p).Current), p.String())
		}
		for _, p := range spec.Pools() {
			ch <- prometheus.MustNewConstMetric(m.peak, prometheus.GaugeValue, float64(ps.Of(p).Peak), p.String())
		}
		ch <- prometheus.MustNewConstMetric(m.peak, prometheus.GaugeValue, float64(ps.All.Peak), "all")
	}
	for _, m := range c.counters {
		if m.pool != nil {
			ps := m.pool(&st)
			for _, p := range spec.Pools() {
				ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, float64(ps.Of(p).Allocated), p.String())
			}
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.CounterValue, m.get(&st))
	}
}
