// Package spec is the vocabulary every xseg allocator shares with its
// users: the configuration (Config, DefaultConfig, ParseConfig for the
// XSEG_CONF syntax, ConfigFromEnv and ApplyEnv for the environment), the
// statistics (Stats, with PyTorch's meanings), the snapshot of segments,
// mapped ranges and blocks (Snapshot), the private-pool ids and
// checkpoints of CUDA graph captures (PoolID, PoolCheckpoint), the
// statistics of tags that pause and resume (TagStats, ErrPaused) and the
// events of the allocation history (HistoryEvent).
//
// It holds values and their parsing only, no allocator: it imports
// nothing of the module but vmm, so that programs, exporters of metrics
// and tools can use these types without the allocators, and the
// allocators (packages expandable and fallback, and the root package
// xseg, which re-exports the names) share one definition. The values are
// plain data, safe to copy; a value shared between goroutines needs the
// caller's synchronisation, as any Go value does.
package spec
