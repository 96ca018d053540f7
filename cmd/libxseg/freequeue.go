package main

/*
#include "freequeue.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/xseg-dev/xseg/vmm"
)

// The free queue. A call from C into Go costs more than the warm
// allocation it makes (the runtime enters and leaves a system-call state
// and takes a lock on every such call from a thread it did not start), and
// xseg_free never reports to its caller. So xseg_free (shim.c) parks the
// pointer and device in a fixed ring in C memory, struct xseg_fq, without
// calling Go, and every export applies the parked frees before it does its
// own work: xseg_malloc before it allocates, xseg_stats_json before it
// counts, xseg_last_error before it reads the last failure, the pool hooks
// before a capture begins or ends.
//
// What a caller can see is unchanged: any call into the library made after
// xseg_free returned, from any thread ordered after it, finds the block
// freed (drainFrees returns only when every free parked before it began is
// applied). A parked block is not reused before it is applied, so deferring
// a free is never unsafe; it only delays reuse to the next call. A bad free
// is recorded, as before, under "xseg_free: ", by the call that applies it,
// before that call does anything else; xseg_last_error applies first too.
// A full ring (XSEG_FQ_CAP frees and no call into Go between them) sends
// the free that finds it full through Go at once, after the parked ones.
// A configuration with a release threshold (release_threshold_mb), whose
// pages go back at the free itself, turns the queue off (direct).

// fqApplied counts the parked frees applied (it wraps as the ring's tail
// does), always a prefix of the ring: a drain publishes its chunk only
// after every chunk taken before it. A drain that finds it equal to the
// tail has nothing to do: every parked free is applied, none is being
// applied.
var fqApplied atomic.Uint32

// fqChunk is the most entries a drain takes from the ring at once.
const fqChunk = 8

// fqCap is the ring's capacity, XSEG_FQ_CAP.
const fqCap = C.XSEG_FQ_CAP

// backOff is one turn of a spin wait: after 64 turns (as shim.c's lock)
// it yields the thread.
func backOff(spins int) {
	if spins >= 64 {
		runtime.Gosched()
	}
}

// drainFrees applies every parked free, in the order parked.
func drainFrees() { drainWith(applyFree) }

// applyFree applies one parked free, recording a failure as xseg_free's.
func applyFree(ptr uint64, dev int) {
	if err := lib.free(vmm.DevicePtr(ptr), dev); err != nil {
		fail("xseg_free", fmt.Errorf("%#x on device %d: %w", ptr, dev, err))
	}
}

// drainWith takes the parked frees in order and gives each to apply. It
// returns once every free parked before it began is applied, by it or by
// a drain on another thread that took some of them first.
func drainWith(apply func(ptr uint64, dev int)) {
	q := &C.xseg_fq
	target := atomic.LoadUint32((*uint32)(unsafe.Pointer(&q.tail)))
	if fqApplied.Load() == target {
		return
	}
	for {
		var chunk [fqChunk]C.struct_xseg_fq_entry
		h, k := fqTake(q, chunk[:])
		if k == 0 {
			break
		}
		applyChunk(h, chunk[:k], apply)
	}
	for spins := 0; int32(target-fqApplied.Load()) > 0; spins++ {
		backOff(spins)
	}
}

// applyChunk applies es, the entries taken from ring position h on, and
// then, once every earlier chunk is published, publishes them: fqApplied
// becomes h+len(es).
func applyChunk(h uint32, es []C.struct_xseg_fq_entry, apply func(ptr uint64, dev int)) {
	for _, e := range es {
		applyOne(uint64(e.ptr), int(e.device), apply)
	}
	for spins := 0; fqApplied.Load() != h; spins++ {
		backOff(spins)
	}
	fqApplied.Store(h + uint32(len(es)))
}

// applyOne applies one free; a panic is recorded as xseg_free's failure
// and goes no further, so that the other frees are applied and published.
func applyOne(ptr uint64, dev int, apply func(ptr uint64, dev int)) {
	defer func() {
		if r := recover(); r != nil {
			fail("xseg_free", fmt.Errorf("panic: %v", r))
		}
	}()
	apply(ptr, dev)
}

// fqTake moves up to len(out) parked entries, oldest first, into out under
// the ring's lock and returns the ring position of the first and how many.
func fqTake(q *C.struct_xseg_fq, out []C.struct_xseg_fq_entry) (uint32, int) {
	lock := (*int32)(unsafe.Pointer(&q.lock))
	for spins := 0; !atomic.CompareAndSwapInt32(lock, 0, 1); spins++ {
		backOff(spins)
	}
	// head and tail change only under the lock, whose taking and release
	// are full barriers here and in shim.c: plain reads and writes do.
	h := uint32(q.head)
	k := min(int(uint32(q.tail)-h), len(out)) // uint32 difference: wraps
	for i := range k {
		out[i] = q.buf[(h+uint32(i))&(fqCap-1)]
	}
	q.head = C.uint32_t(h + uint32(k))
	atomic.StoreInt32(lock, 0)
	return h, k
}

// setFreesDirect turns the queue off (on: every xseg_free calls Go at
// once) or back on.
func setFreesDirect(on bool) {
	v := int32(0)
	if on {
		v = 1
	}
	atomic.StoreInt32((*int32)(unsafe.Pointer(&C.xseg_fq.direct)), v)
}

// parkFree parks a free as xseg_free does, for tests: false when the ring
// is full or direct.
func parkFree(ptr uint64, dev int) bool { return C.xseg_fq_push(C.uint64_t(ptr), C.int(dev)) != 0 }

func init() {
	lib.onStart = func(releaseThreshold uint64) { setFreesDirect(releaseThreshold > 0) }
}
