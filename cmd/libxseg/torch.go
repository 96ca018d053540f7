package main

/*
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dustin/go-humanize"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// The exports python/xseg uses to stand in for PyTorch's own allocator:
// allocation with size reduction, a free that reports failure, pool
// retain and release for torch.cuda.MemPool, and the out-of-memory message
// that xseg_malloc_or_throw raises as torch.OutOfMemoryError.

// mallocAtMost is AllocAtMost on dev's allocator: the largest block of at
// most max and at least min bytes it can get, shrinking by the configured
// oom_size_factor.
func (l *library) mallocAtMost(max, min uint64, dev int, s vmm.Stream) (vmm.DevicePtr, uint64, error) {
	if min == 0 || min > max || min > 1<<62 {
		return 0, 0, fmt.Errorf("between %d and %d bytes: need 0 < min <= max and min <= 2^62: %w", min, max, vmm.ErrInvalid)
	}
	if max > 1<<62 {
		max = 1 << 62 // a larger max asks for as much as possible, as Python's does
	}
	a, err := l.allocator(dev)
	if err != nil {
		return 0, 0, err
	}
	return a.AllocAtMost(max, min, s)
}

//export xsegGoMallocAtMost
func xsegGoMallocAtMost(max, min C.size_t, device C.int, stream C.uintptr_t, got *C.size_t) (ptr C.uintptr_t) {
	defer catch("xseg_malloc_at_most")
	drainFrees()
	p, n, err := lib.mallocAtMost(uint64(max), uint64(min), int(device), vmm.Stream(stream))
	if err != nil {
		fail("xseg_malloc_at_most", fmt.Errorf("on device %d: %w", int(device), err))
		return 0
	}
	if got != nil {
		*got = C.size_t(n)
	}
	return C.uintptr_t(p)
}

//export xsegGoFreeBlock
func xsegGoFreeBlock(ptr C.uintptr_t, device C.int) (rc C.int) {
	rc = -1
	defer catch("xseg_free_block")
	drainFrees()
	err := lib.free(vmm.DevicePtr(ptr), int(device))
	if err != nil {
		err = fmt.Errorf("%#x on device %d: %w", uintptr(ptr), int(device), err)
	}
	return status("xseg_free_block", err)
}

// retainPool holds one more use of pool id of dev, making it if need be:
// torch.cuda.MemPool's createOrIncrefPool.
func (l *library) retainPool(dev int, id xseg.PoolID) error {
	p, err := l.pools(dev)
	if err != nil {
		return err
	}
	return p.RetainPool(id)
}

//export xsegGoPoolRetain
func xsegGoPoolRetain(device C.int, first, second C.ulonglong) (rc C.int) {
	rc = -1
	defer catch("xseg_pool_retain")
	drainFrees()
	id := poolID(first, second)
	return status("xseg_pool_retain", wrapPool("retaining", id, device, lib.retainPool(int(device), id)))
}

// oomText is the message of an allocation that failed for want of memory,
// shaped like PyTorch's own ("CUDA out of memory. Tried to allocate ...")
// so that code matching on it, and people reading it, find what they
// expect, followed by what xseg knows.
func (l *library) oomText(size int64, dev int, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "CUDA out of memory. Tried to allocate %s.", humanize.IBytes(uint64(max(size, 0))))
	if drv := l.driver(); drv != nil {
		if free, total, merr := drv.MemInfo(vmm.Device(dev)); merr == nil {
			fmt.Fprintf(&b, " GPU %d has a total capacity of %s of which %s is free.", dev, humanize.IBytes(total), humanize.IBytes(free))
		}
	}
	if a, _ := l.existing(dev); a != nil {
		st := a.Stats()
		res, alloc := st.ReservedBytes.All.Current, st.AllocatedBytes.All.Current
		fmt.Fprintf(&b, " Of the memory xseg holds on it, %s is allocated and %s reserved but unallocated; %d allocation retries so far.",
			humanize.IBytes(uint64(max(alloc, 0))), humanize.IBytes(uint64(max(res-alloc, 0))), st.NumAllocRetries)
	}
	fmt.Fprintf(&b, " xseg: %v", err)
	return b.String()
}

// mallocError hands the failure of one allocation to the C++ caller:
// its text in *errText (C memory the caller frees) and, in *oom, whether
// it is out of memory (thrown as torch.OutOfMemoryError) or another
// failure (a RuntimeError).
func mallocError(size int64, dev int, err error, errText **C.char, oom *C.int) {
	isOOM := errors.Is(err, vmm.ErrOutOfMemory)
	text := "xseg_malloc: " + err.Error()
	if isOOM {
		text = lib.oomText(size, dev, err)
	}
	if errText != nil {
		*errText = C.CString(text)
	}
	if oom != nil && isOOM {
		*oom = 1
	}
}
