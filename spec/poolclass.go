package spec

import (
	"fmt"
	"unsafe"
)

// The shared pools as data. A request goes to the first class whose
// MaxRequest it does not pass; each class has its own page size (for
// fallback: segment size) and its own statistics (PoolStat). The code
// that handles pools iterates over the classes or indexes arrays of
// NumPools by Pool: a new class is a new Pool constant, a name in
// poolNames, a field of PoolStat and a row of Config.PoolClasses.

// NumPools is the number of shared pools: Pool values are 0 .. NumPools-1.
const NumPools = int(Large) + 1

// poolNames are the pools' names, by Pool; PoolStat's JSON keys are the
// names with "_pool" appended, as PyTorch's memory_stats names them.
var poolNames = [NumPools]string{Small: "small", Large: "large"}

// PoolClass describes one shared pool.
type PoolClass struct {
	// Pool is the class's pool.
	Pool Pool
	// PageSize is the size of the pool's physical pages (for fallback:
	// its shared segments).
	PageSize uint64
	// MaxRequest is the largest request (rounded) the pool takes; 0 for
	// the last class, which takes every request the others do not.
	MaxRequest uint64
	// PageKey is the configuration key of PageSize (ParseConfig).
	PageKey string
}

// PoolClasses returns the shared pools of c in the order a request is
// matched against them: small (requests up to SmallLimit, pages of
// SmallPageSize), then large (pages of LargePageSize).
func (c Config) PoolClasses() [NumPools]PoolClass {
	return [NumPools]PoolClass{
		{Pool: Small, PageSize: c.SmallPageSize, MaxRequest: c.SmallLimit, PageKey: "small_page_mb"},
		{Pool: Large, PageSize: c.LargePageSize, PageKey: "large_page_mb"},
	}
}

// PoolOf is the pool of a request of size bytes (rounded).
func (c Config) PoolOf(size uint64) Pool {
	classes := c.PoolClasses()
	for _, pc := range classes[:NumPools-1] {
		if size <= pc.MaxRequest {
			return pc.Pool
		}
	}
	return classes[NumPools-1].Pool
}

// PageSize is the page size of pool p. A pool out of range panics.
func (c Config) PageSize(p Pool) uint64 { return c.PoolClasses()[p].PageSize }

// PageMates lists, in pool order, the other pools whose pages are the
// same size as p's: a physical page of one fits any range of the others,
// so they may hand pages to each other.
func (c Config) PageMates(p Pool) []Pool {
	var mates []Pool
	for _, pc := range c.PoolClasses() {
		if pc.Pool != p && pc.PageSize == c.PageSize(p) {
			mates = append(mates, pc.Pool)
		}
	}
	return mates
}

// Pools lists every shared pool, in order.
func Pools() [NumPools]Pool {
	var ps [NumPools]Pool
	for i := range ps {
		ps[i] = Pool(i)
	}
	return ps
}

// String is the pool's name ("small", "large"); a pool out of range is
// "Pool(n)".
func (p Pool) String() string {
	if p >= 0 && int(p) < NumPools {
		return poolNames[p]
	}
	return fmt.Sprintf("Pool(%d)", int(p))
}

// Of is the counter of pool p. A pool out of range panics (an index out
// of range): no pool silently counts as another.
func (s *PoolStat) Of(p Pool) *Stat { return &s.pools()[p] }

// pools is the per-pool counters as an array, by Pool: PoolStat's fields
// after All are one Stat a pool in Pool order (TestPoolStatLayout checks
// it), which the allocation path indexes without a branch.
func (s *PoolStat) pools() *[NumPools]Stat { return (*[NumPools]Stat)(unsafe.Pointer(&s.Small)) }
