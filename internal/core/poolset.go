package core

import "github.com/xseg-dev/xseg/vmm"

// PoolSet is the private-pool half of an allocator's API (the root
// package's xseg.Pools), over a Heap. Both allocators embed it, so the
// methods are written once.
type PoolSet struct{ h *Heap }

// NewPoolSet returns the pools of h.
func NewPoolSet(h *Heap) PoolSet { return PoolSet{h: h} }

// BeginAllocateToPool retains private pool id and routes to it, until
// EndAllocateToPool, every allocation whose stream filter accepts. filter
// runs with the allocator's lock held and must not call the allocator; nil
// routes nothing (AllocInPool still reaches the pool).
func (p PoolSet) BeginAllocateToPool(id PoolID, filter func(vmm.Stream) bool) error {
	return p.h.BeginAllocateToPool(id, filter)
}

// EndAllocateToPool stops routing allocations to pool id.
func (p PoolSet) EndAllocateToPool(id PoolID) error { return p.h.EndAllocateToPool(id) }

// RetainPool makes pool id if need be and holds one more use of it.
func (p PoolSet) RetainPool(id PoolID) error { return p.h.RetainPool(id) }

// ReleasePool drops one use of pool id; the last gives its memory back.
func (p PoolSet) ReleasePool(id PoolID) error { return p.h.ReleasePool(id) }

// AllocInPool allocates size bytes for stream s from retained pool id.
func (p PoolSet) AllocInPool(id PoolID, size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	return p.h.AllocInPool(id, size, s)
}

// PoolAllocations lists the blocks allocated in pool id.
func (p PoolSet) PoolAllocations(id PoolID) ([]vmm.DevicePtr, error) {
	return p.h.PoolAllocations(id)
}

// CheckpointPool records which blocks of pool id are allocated.
func (p PoolSet) CheckpointPool(id PoolID) (PoolCheckpoint, error) { return p.h.CheckpointPool(id) }

// RestorePool puts a pool back to a checkpoint; it returns the blocks it
// freed and those it allocated again.
func (p PoolSet) RestorePool(cp PoolCheckpoint) (freed, allocated []vmm.DevicePtr, err error) {
	return p.h.RestorePool(cp)
}
