package main

import (
	"encoding/json"
	"fmt"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// Private pools for CUDA graph captures. PyTorch's filter (which stream, or
// which thread, allocates to the pool) is a C++ std::function that
// pools.cc keeps; it routes each allocation and calls mallocInPool for the
// ones its filter accepts. The Go side keeps the pools themselves.

// pools returns dev's allocator's private pools, making the allocator if
// need be.
func (l *library) pools(dev int) (xseg.Pools, error) {
	a, err := l.allocator(dev)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// beginPool retains pool id of dev and marks it active; the routing itself
// is done in C++.
func (l *library) beginPool(dev int, id xseg.PoolID) error {
	p, err := l.pools(dev)
	if err != nil {
		return err
	}
	return p.BeginAllocateToPool(id, nil)
}

func (l *library) endPool(dev int, id xseg.PoolID) error {
	p, err := l.pools(dev)
	if err != nil {
		return err
	}
	return p.EndAllocateToPool(id)
}

func (l *library) releasePool(dev int, id xseg.PoolID) error {
	p, err := l.pools(dev)
	if err != nil {
		return err
	}
	return p.ReleasePool(id)
}

// mallocInPool is malloc from private pool id.
func (l *library) mallocInPool(size int64, dev int, s vmm.Stream, id xseg.PoolID) (vmm.DevicePtr, error) {
	if size <= 0 {
		return l.malloc(size, dev, s)
	}
	p, err := l.pools(dev)
	if err != nil {
		return 0, err
	}
	return p.AllocInPool(id, uint64(size), s)
}

// poolJSON returns, as JSON, the addresses of the blocks allocated in pool
// id (checkpoint false) or a checkpoint of the pool (true).
func (l *library) poolJSON(dev int, id xseg.PoolID, checkpoint bool) ([]byte, error) {
	p, err := l.pools(dev)
	if err != nil {
		return nil, err
	}
	if checkpoint {
		cp, err := p.CheckpointPool(id)
		if err != nil {
			return nil, err
		}
		return json.Marshal(cp)
	}
	ptrs, err := p.PoolAllocations(id)
	if err != nil {
		return nil, err
	}
	if ptrs == nil {
		ptrs = []vmm.DevicePtr{}
	}
	return json.Marshal(ptrs)
}

// restoreResult is what restorePool returns, as JSON.
type restoreResult struct {
	Freed     []vmm.DevicePtr `json:"freed"`
	Allocated []vmm.DevicePtr `json:"allocated"`
}

// restorePool puts a pool back to a checkpoint given as poolJSON's JSON.
func (l *library) restorePool(dev int, cpJSON []byte) ([]byte, error) {
	var cp xseg.PoolCheckpoint
	if err := json.Unmarshal(cpJSON, &cp); err != nil {
		return nil, fmt.Errorf("reading the checkpoint: %w: %w", err, vmm.ErrInvalid)
	}
	p, err := l.pools(dev)
	if err != nil {
		return nil, err
	}
	freed, allocated, err := p.RestorePool(cp)
	if err != nil {
		return nil, err
	}
	r := restoreResult{Freed: freed, Allocated: allocated}
	if r.Freed == nil {
		r.Freed = []vmm.DevicePtr{}
	}
	if r.Allocated == nil {
		r.Allocated = []vmm.DevicePtr{}
	}
	return json.Marshal(r)
}
