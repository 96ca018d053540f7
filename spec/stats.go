package spec

// Stat is one counter with PyTorch's meanings: Current and Peak values, and
// the totals ever added (Allocated) and taken away (Freed).
type Stat struct {
	Current   int64 `json:"current"`
	Peak      int64 `json:"peak"`
	Allocated int64 `json:"allocated"`
	Freed     int64 `json:"freed"`
}

// Add changes the counter by n (negative to take away) and keeps the peak.
func (s *Stat) Add(n int64) {
	s.Current += n
	if n < 0 {
		s.Freed -= n
		return
	}
	s.Allocated += n
	if s.Current > s.Peak {
		s.Peak = s.Current
	}
}

// Inc adds n to the counter and keeps the peak: Add for an n known to be
// positive, without the sign test (the allocation path calls it).
func (s *Stat) Inc(n uint64) {
	s.Current += int64(n)
	s.Allocated += int64(n)
	if s.Current > s.Peak {
		s.Peak = s.Current
	}
}

// Dec takes n away from the counter: Add(-n) without the sign test.
func (s *Stat) Dec(n uint64) {
	s.Current -= int64(n)
	s.Freed += int64(n)
}

// ResetPeak makes the peak the current value.
func (s *Stat) ResetPeak() { s.Peak = s.Current }

// PoolStat is a counter for all pools together and for each pool, as
// PyTorch's "all", "small_pool" and "large_pool".
type PoolStat struct {
	All   Stat `json:"all"`
	Small Stat `json:"small_pool"`
	Large Stat `json:"large_pool"`
}

// Pool names the pool of a block: requests up to the small-pool limit
// (Config.SmallLimit: 0 by default, so every request is large; 1 MiB
// under ClassicConfig) are small, the rest large.
type Pool int

const (
	// Small is the pool of requests up to Config.SmallLimit.
	Small Pool = iota
	// Large is the pool of the other requests.
	Large
)

// Add changes the counter of pool p and of all pools by n (negative to
// take away).
func (s *PoolStat) Add(p Pool, n int64) {
	s.All.Add(n)
	s.Of(p).Add(n)
}

// Inc adds n to the counter of pool p and of all pools.
func (s *PoolStat) Inc(p Pool, n uint64) {
	s.All.Inc(n)
	s.Of(p).Inc(n)
}

// Dec takes n away from the counter of pool p and of all pools.
func (s *PoolStat) Dec(p Pool, n uint64) {
	s.All.Dec(n)
	s.Of(p).Dec(n)
}

// ResetPeak resets the peaks of all the counters.
func (s *PoolStat) ResetPeak() {
	s.All.ResetPeak()
	for _, p := range Pools() {
		s.Of(p).ResetPeak()
	}
}

// Stats are an allocator's statistics, with the meanings of PyTorch's
// torch.cuda.memory_stats:
//   - AllocatedBytes: bytes of blocks handed out to callers (rounded sizes).
//   - ReservedBytes: bytes of device memory held by the allocator (mapped
//     pages for the expandable allocator, segments for fallback).
//   - ActiveBytes: allocated bytes plus freed blocks still waiting for
//     stream work to complete before reuse.
//   - RequestedBytes: bytes callers asked for, before rounding.
//   - Allocations / Segments / ActiveBlocks: counts.
type Stats struct {
	AllocatedBytes PoolStat `json:"allocated_bytes"`
	ReservedBytes  PoolStat `json:"reserved_bytes"`
	ActiveBytes    PoolStat `json:"active_bytes"`
	RequestedBytes PoolStat `json:"requested_bytes"`
	Allocations    PoolStat `json:"allocation"`
	ActiveBlocks   PoolStat `json:"active"`
	Segments       PoolStat `json:"segment"`

	NumAllocRetries int64 `json:"num_alloc_retries"`
	NumOOMs         int64 `json:"num_ooms"`
	// Maps and Unmaps count pages mapped and unmapped; MapCalls and
	// SetAccessCalls the driver calls that did it (a run of pages takes one
	// set-access call).
	Maps           int64 `json:"num_maps"`
	Unmaps         int64 `json:"num_unmaps"`
	SetAccessCalls int64 `json:"num_set_access_calls"`
	// Syncs counts waits on events or streams the allocator made.
	Syncs int64 `json:"num_syncs"`
	// PagesCreated and PagesReused count physical pages made with the
	// driver and taken from the released-page cache.
	PagesCreated int64 `json:"num_pages_created"`
	PagesReused  int64 `json:"num_pages_reused"`
	// PagesRetired counts pages a growth took from a free block of its
	// stream without waiting for the stream, unmapping their old
	// addresses later (Config.RecyclePages).
	PagesRetired int64 `json:"num_pages_retired"`
	// SyncNanos is the time the allocator spent in the waits Syncs counts,
	// in nanoseconds; PageNanos the time in its page work: making pages
	// usable (taking or creating physical pages, mapping them, granting
	// access) and giving them back (unmapping, retiring, releasing). Both
	// are wall time on the calling thread, which they held up.
	SyncNanos int64 `json:"sync_ns"`
	PageNanos int64 `json:"page_ns"`
	// MemoryLimit is the cap on ReservedBytes (SetMemoryLimit,
	// SetMemoryFraction), 0 when there is none: a setting, not a count.
	// MemoryLimitSet tells a cap of 0 bytes (a memory fraction of 0: no
	// growth at all) from none.
	MemoryLimit    uint64 `json:"memory_limit_bytes"`
	MemoryLimitSet bool   `json:"memory_limit_set"`
}

// ResetAccumulated zeroes what only grows, as PyTorch's
// reset_accumulated_memory_stats: every counter's Allocated and Freed
// totals, the retry and OOM counts and the counts and times of driver work. Current
// and peak values stay.
func (s *Stats) ResetAccumulated() {
	for _, p := range []*PoolStat{&s.AllocatedBytes, &s.ReservedBytes, &s.ActiveBytes, &s.RequestedBytes, &s.Allocations, &s.ActiveBlocks, &s.Segments} {
		p.All.Allocated, p.All.Freed = 0, 0
		for _, pool := range Pools() {
			st := p.Of(pool)
			st.Allocated, st.Freed = 0, 0
		}
	}
	s.NumAllocRetries, s.NumOOMs = 0, 0
	s.Maps, s.Unmaps, s.SetAccessCalls, s.Syncs, s.PagesCreated, s.PagesReused, s.PagesRetired = 0, 0, 0, 0, 0, 0, 0
	s.SyncNanos, s.PageNanos = 0, 0
}

// ResetPeaks makes every peak the current value.
func (s *Stats) ResetPeaks() {
	for _, p := range []*PoolStat{&s.AllocatedBytes, &s.ReservedBytes, &s.ActiveBytes, &s.RequestedBytes, &s.Allocations, &s.ActiveBlocks, &s.Segments} {
		p.ResetPeak()
	}
}
