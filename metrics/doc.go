// Package metrics exports an xseg allocator's statistics to Prometheus and
// to log/slog.
//
// [New] makes a prometheus.Collector over anything with a Stats method (an
// xseg.Allocator, an *expandable.Allocator): register it once and every
// scrape reads the statistics afresh, with one Stats call. The names follow
// Prometheus' conventions (base units, _total for counters) and the
// meanings are PyTorch's torch.cuda.memory_stats (see spec.Stats):
//
//	xseg_allocated_bytes{pool}        bytes of blocks handed out
//	xseg_reserved_bytes{pool}         bytes of device memory held (mapped and cached pages)
//	xseg_active_bytes{pool}           allocated plus freed blocks awaiting stream work
//	xseg_requested_bytes{pool}        bytes asked for, before rounding
//	xseg_allocations{pool}            blocks handed out now
//	xseg_active_blocks{pool}          active blocks now
//	xseg_segments{pool}               segments now
//	xseg_<each of the above>_peak{pool}
//	xseg_allocations_made_total{pool} blocks ever handed out
//	xseg_alloc_retries_total          allocations retried after freeing cached memory
//	xseg_ooms_total                   out-of-memory errors returned
//	xseg_maps_total, xseg_unmaps_total    pages mapped and unmapped
//	xseg_set_access_calls_total       set-access driver calls (one per run of pages)
//	xseg_syncs_total                  waits on events or streams
//	xseg_pages_created_total, xseg_pages_reused_total
//	xseg_sync_seconds_total           time spent in those waits
//	xseg_page_seconds_total           time spent making pages usable and giving them back
//
// Every name is one metric family in both the Prometheus text format and
// OpenMetrics, whose family of a counter is its name less _total.
//
// The pool label is "small" or "large" on the current values, so that
// sum() is the allocator's total. The peaks carry pool="all" as well,
// since the peak of the total is not the sum of the pools' peaks. Const
// labels given to New (a device ordinal, a backend) go on every series.
//
// [Attr] turns the same statistics into a slog attribute for log lines.
//
// A Collector is safe for concurrent use if its source's Stats is, as the
// allocators' is.
package metrics
