package main

/*
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// The Go side of pools.cc: PyTorch's begin/end-allocate-to-pool and
// release-pool hooks, allocation in a pool, and the pool queries that
// python/xseg_torch.py uses for torch.compile's CUDA graph trees.

func poolID(first, second C.ulonglong) xseg.PoolID {
	return xseg.PoolID{First: uint64(first), Second: uint64(second)}
}

//export xsegGoBeginPool
func xsegGoBeginPool(device C.int, first, second C.ulonglong) (rc C.int) {
	rc = -1
	defer catch("xseg_begin_allocate_to_pool")
	drainFrees()
	id := poolID(first, second)
	return status("xseg_begin_allocate_to_pool", wrapPool("beginning to allocate to", id, device, lib.beginPool(int(device), id)))
}

//export xsegGoEndPool
func xsegGoEndPool(device C.int, first, second C.ulonglong) (rc C.int) {
	rc = -1
	defer catch("xseg_end_allocate_to_pool")
	drainFrees()
	id := poolID(first, second)
	return status("xseg_end_allocate_to_pool", wrapPool("ending allocation to", id, device, lib.endPool(int(device), id)))
}

//export xsegGoReleasePool
func xsegGoReleasePool(device C.int, first, second C.ulonglong) (rc C.int) {
	rc = -1
	defer catch("xseg_release_pool")
	drainFrees()
	id := poolID(first, second)
	return status("xseg_release_pool", wrapPool("releasing", id, device, lib.releasePool(int(device), id)))
}

func wrapPool(what string, id xseg.PoolID, device C.int, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s pool %v on device %d: %w", what, id, int(device), err)
}

// xsegGoMallocInPool is xsegGoMallocOrError from private pool (first,
// second); errText and oom may be NULL.
//
//export xsegGoMallocInPool
func xsegGoMallocInPool(size C.ssize_t, device C.int, stream C.uintptr_t, first, second C.ulonglong, errText **C.char, oom *C.int) (ptr C.uintptr_t) {
	defer catch("xseg_malloc")
	drainFrees()
	id := poolID(first, second)
	p, err := lib.mallocInPool(int64(size), int(device), vmm.Stream(stream), id)
	if err != nil {
		err = fmt.Errorf("%d bytes on device %d in pool %v: %w", int64(size), int(device), id, err)
		fail("xseg_malloc", err)
		mallocError(int64(size), int(device), err, errText, oom)
		return 0
	}
	return C.uintptr_t(p)
}

//export xsegGoPoolJSON
func xsegGoPoolJSON(device C.int, first, second C.ulonglong, checkpoint C.int) (s *C.char) {
	defer catch("xseg_pool_json")
	drainFrees()
	b, err := lib.poolJSON(int(device), poolID(first, second), checkpoint != 0)
	return jsonOut("xseg_pool_json", b, err)
}

//export xsegGoPoolRestore
func xsegGoPoolRestore(device C.int, checkpoint *C.char, n C.size_t) (s *C.char) {
	defer catch("xseg_pool_restore")
	drainFrees()
	if checkpoint == nil || n > 1<<30 {
		fail("xseg_pool_restore", fmt.Errorf("checkpoint NULL or over 1 GiB (%d bytes): %w", uint64(n), vmm.ErrInvalid))
		return nil
	}
	b, err := lib.restorePool(int(device), C.GoBytes(unsafe.Pointer(checkpoint), C.int(n)))
	return jsonOut("xseg_pool_restore", b, err)
}
