package core

import "github.com/xseg-dev/xseg/vmm"

// MaxExact is maxExact, for the tests of package core_test.
const MaxExact = maxExact

// AllocLongLived allocates size bytes on stream s as a request predicted
// long-lived (Config.PackLongLived), whatever the prediction would say:
// for tests of where such a block goes. Default stream, shared pools.
func (h *Heap) AllocLongLived(size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	rs, pool := h.sizeClass(size)
	h.mu.Lock()
	defer h.mu.Unlock()
	pred := packPred{long: true, slot: -1}
	b, err := h.allocLocked(size, rs, pool, s, true, PoolID{}, &pred)
	if err != nil {
		return 0, err
	}
	return b.ptr, nil
}
