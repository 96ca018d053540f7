package metrics

import (
	"log/slog"

	"github.com/xseg-dev/xseg/spec"
)

// Attr returns st as a slog group attribute under key: the current and
// peak allocated and reserved bytes, the counts of allocations and
// segments, retries and OOMs, pages mapped and unmapped. For example:
//
//	log.Info("memory", metrics.Attr("xseg", a.Stats()))
func Attr(key string, st spec.Stats) slog.Attr {
	return slog.Group(key,
		slog.Int64("allocated_bytes", st.AllocatedBytes.All.Current),
		slog.Int64("allocated_bytes_peak", st.AllocatedBytes.All.Peak),
		slog.Int64("reserved_bytes", st.ReservedBytes.All.Current),
		slog.Int64("reserved_bytes_peak", st.ReservedBytes.All.Peak),
		slog.Int64("allocations", st.Allocations.All.Current),
		slog.Int64("segments", st.Segments.All.Current),
		slog.Int64("alloc_retries", st.NumAllocRetries),
		slog.Int64("ooms", st.NumOOMs),
		slog.Int64("maps", st.Maps),
		slog.Int64("unmaps", st.Unmaps),
	)
}
