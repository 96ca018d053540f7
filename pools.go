package xseg

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// PoolID names a private pool, as PyTorch's MempoolId_t does; the zero
// value names none.
type PoolID = spec.PoolID

// PoolCheckpoint is the allocation state of a private pool at one moment.
type PoolCheckpoint = spec.PoolCheckpoint

// Pools is what both allocators offer for CUDA graph captures: private
// pools, as PyTorch's caching allocator keeps them.
//
// A graph replays its kernels at the addresses they had during capture,
// temporaries freed inside the capture included, so a capture's memory must
// go to nothing else while the graph lives. BeginAllocateToPool retains a
// pool and routes to it the allocations its filter accepts (PyTorch's
// filter accepts the capturing stream) until EndAllocateToPool; blocks
// allocated there go back to the pool when freed, during the capture or
// after it, and nothing outside the pool is ever given them. Two captures
// that use one pool id share the pool. The filter runs inside every
// allocation, under the allocator's lock: it must be quick and must not
// call the allocator (that deadlocks) or wait for anything that does; a
// nil filter accepts nothing (only AllocInPool reaches the pool). ReleasePool drops a use (PyTorch
// releases when a graph is destroyed); the last one gives the pool's free
// pages back at once and the rest as its blocks are freed.
//
// While any pool is active the allocator calls nothing that stream capture
// forbids: no event query or record, no synchronize, no unmap. Frees of
// blocks used on other streams wait to record their events until no pool
// is active; EmptyCache fails with vmm.ErrInUse; an allocation that finds
// no memory fails without emptying the cache. Pages of a pool in use are
// never unmapped: not by EmptyCache, the OOM policy or a release threshold.
//
// CheckpointPool and RestorePool serve CUDA graph trees
// (torch.compile(mode="reduce-overhead")), which rewind a pool's books to
// the moment after a recording.
type Pools interface {
	BeginAllocateToPool(id PoolID, filter func(vmm.Stream) bool) error
	EndAllocateToPool(id PoolID) error
	RetainPool(id PoolID) error
	ReleasePool(id PoolID) error
	AllocInPool(id PoolID, size uint64, s vmm.Stream) (vmm.DevicePtr, error)
	PoolAllocations(id PoolID) ([]vmm.DevicePtr, error)
	CheckpointPool(id PoolID) (PoolCheckpoint, error)
	RestorePool(cp PoolCheckpoint) (freed, allocated []vmm.DevicePtr, err error)
}

// ErrNoPools: the allocator has no private pools.
var ErrNoPools = errors.New("xseg: allocator has no private pools")

// PoolsOf returns a's private pools: a itself for both xseg allocators
// and for Open's DeviceAllocator, else an error matching ErrNoPools.
func PoolsOf(a Allocator) (Pools, error) {
	if p, ok := a.(Pools); ok {
		return p, nil
	}
	return nil, fmt.Errorf("%T: %w: %w", a, ErrNoPools, vmm.ErrNotSupported)
}
