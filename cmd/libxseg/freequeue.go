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
// pages go back at the free itself, turns the queue off (direct), and so
// does an allocation waiting in the OOM policy for as long as it waits
// (oomWait).

// fqApplied counts the parked frees applied (it wraps as the ring's tail
// does), always a prefix of the ring: a drain publishes its chunk only
// after every chunk taken before it. A drain that finds it equal to the
// tail has nothing to do: every parked free is applied, none is being
// applied.
var fqApplied atomic.Uint32

// fqChunk is the most entries a drain takes from the ring at once.
const fqChunk = 8

// fqCap is the ring's capacity, XSEG_FQ_CAP; fqScan how many of its newest
// entries xseg_malloc looks at to take a block back, XSEG_FQ_SCAN.
const (
	fqCap  = C.XSEG_FQ_CAP
	fqScan = C.XSEG_FQ_SCAN
)

// backOff is one turn of a spin wait: after 64 turns (as shim.c's lock)
// it yields the thread.
func backOff(spins int) {
	if spins >= 64 {
		runtime.Gosched()
	}
}

// Taking blocks back. A parked free whose block xseg_malloc handed out
// (xseg_fq_remember: the block, its request, device and stream) is parked
// REUSABLE, and a later xseg_malloc or xseg_malloc_or_throw of exactly that
// request on that device and stream, with no route of a CUDA graph or
// region on the call, takes the most recent such block back (among the
// last XSEG_FQ_SCAN parked) without calling Go: the entry becomes REUSED,
// and the drain counts an allocation and a free of the block
// (CountReused) instead of freeing it. Go never saw the free, so its books
// are right without it: the block stays allocated for the same request on
// the same stream, and a block freed and reallocated on its own stream
// needs no wait.
//
// Only blocks of the plain path qualify: Go says so when it allocates
// (AllocReusable: no history, pins, routes or release threshold, and a
// block smaller than a page: larger ones decide which pages can be
// unmapped, and Go's Free and Alloc let them merge and be placed anew), and
// the answer holds only within one epoch (xseg_fq.epoch): every export
// but the plain allocation and free starts a new one when it begins
// (drainFrees) and when it returns (catch). So a block recorded for
// history, shared, used on another stream, paused, or allocated or freed
// around a capture, a configuration change or anything else never comes
// back this way: after any such call the remembered blocks and parked
// entries of the epoch before are ignored. The C side trusts nothing the
// caller of xseg_free says: the request and stream come from what
// xseg_malloc recorded for that address in that epoch.

// loadEpoch is the free queue's epoch.
func loadEpoch() uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&C.xseg_fq.epoch)))
}

// newEpoch starts a new epoch of the free queue (never 0, which turns
// taking back off).
func newEpoch() {
	if atomic.AddUint32((*uint32)(unsafe.Pointer(&C.xseg_fq.epoch)), 1) == 0 {
		atomic.AddUint32((*uint32)(unsafe.Pointer(&C.xseg_fq.epoch)), 1)
	}
}

// mallocPlain is malloc for the C API's plain path: it sets *epoch to the
// free queue's epoch read before allocating if the block may be taken
// back (freequeue.go), else to 0.
func mallocPlain(size int64, dev int, s vmm.Stream, epoch *C.uint32_t) (vmm.DevicePtr, error) {
	e := loadEpoch()
	p, ok, err := lib.mallocReusable(size, dev, s)
	if epoch != nil {
		*epoch = 0
		if err == nil && ok {
			*epoch = C.uint32_t(e)
		}
	}
	return p, err
}

// drainFrees starts a new epoch and applies every parked free, in the
// order parked: what every export but the plain allocation and free does
// first.
func drainFrees() {
	newEpoch()
	drainWith(applyFree)
}

// drainPlain applies every parked free and leaves the epoch.
func drainPlain() { drainWith(applyFree) }

// applyFree applies one parked free, recording a failure as xseg_free's,
// or counts a block taken back.
func applyFree(ptr uint64, dev int, reused bool) {
	if reused {
		a, err := lib.existing(dev)
		if err == nil && a == nil {
			err = fmt.Errorf("device %d has no allocations: %w", dev, vmm.ErrInvalid)
		}
		if err == nil {
			err = a.CountReused(vmm.DevicePtr(ptr))
		}
		if err != nil {
			fail("xseg_malloc", fmt.Errorf("%#x taken back on device %d: %w", ptr, dev, err))
		}
		return
	}
	if err := lib.free(vmm.DevicePtr(ptr), dev); err != nil {
		fail("xseg_free", fmt.Errorf("%#x on device %d: %w", ptr, dev, err))
	}
}

// drainWith takes the parked frees in order and gives each to apply. It
// returns once every free parked before it began is applied, by it or by
// a drain on another thread that took some of them first.
func drainWith(apply func(ptr uint64, dev int, reused bool)) {
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

// applyChunk applies es, the entries taken from ring position h on, once
// every earlier chunk is applied, and then publishes them: fqApplied
// becomes h+len(es). Chunks are applied in ring order even when drains on
// several threads take them: a block taken back (REUSED) and then freed
// again is two entries, and counting the first after applying the second
// would find the block already free.
func applyChunk(h uint32, es []C.struct_xseg_fq_entry, apply func(ptr uint64, dev int, reused bool)) {
	for spins := 0; fqApplied.Load() != h; spins++ {
		backOff(spins)
	}
	for _, e := range es {
		applyOne(uint64(e.ptr), int(e.device), e.kind == C.XSEG_FQ_REUSED, apply)
	}
	fqApplied.Store(h + uint32(len(es)))
}

// applyOne applies one free; a panic is recorded as xseg_free's failure
// and goes no further, so that the other frees are applied and published.
func applyOne(ptr uint64, dev int, reused bool, apply func(ptr uint64, dev int, reused bool)) {
	defer func() {
		if r := recover(); r != nil {
			fail("xseg_free", fmt.Errorf("panic: %v", r))
		}
	}()
	apply(ptr, dev, reused)
}

// fqTake moves up to len(out) parked entries, oldest first, into out under
// the ring's lock and returns the ring position of the first and how many.
func fqTake(q *C.struct_xseg_fq, out []C.struct_xseg_fq_entry) (uint32, int) {
	lock := fqLock(q)
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

// fqLock takes q's spin lock (shim.c's fq_lock, from Go) and returns it,
// for the caller to give back with a store of 0.
func fqLock(q *C.struct_xseg_fq) *int32 {
	lock := (*int32)(unsafe.Pointer(&q.lock))
	for spins := 0; !atomic.CompareAndSwapInt32(lock, 0, 1); spins++ {
		backOff(spins)
	}
	return lock
}

// The queue's direct word (xseg_fq.direct) is a sum: directConfig while
// the configuration turns the queue off (setFreesDirect), plus one for each
// allocation waiting in the OOM policy (oomWait). Any of them sends every
// xseg_free to Go at once.
const directConfig = 1 << 24

// directByConfig is whether setFreesDirect has added directConfig.
var directByConfig atomic.Bool

// addDirect adds n to the direct word.
func addDirect(n int32) { atomic.AddInt32((*int32)(unsafe.Pointer(&C.xseg_fq.direct)), n) }

// setFreesDirect turns the queue off (on: every xseg_free calls Go at
// once) or back on, as far as the configuration goes: an allocation
// waiting in the OOM policy keeps it off until it stops.
func setFreesDirect(on bool) {
	if directByConfig.Swap(on) == on {
		return
	}
	if on {
		addDirect(directConfig)
	} else {
		addDirect(-directConfig)
	}
}

// oomWait is every allocator's OOM wait hook (SetOOMWaitHook). A free
// parked while an allocation waits for memory would stay parked until
// some later call into the library: the allocation would sleep through
// its whole wait, or every retry, and fail for memory already freed. So
// as an allocation begins to wait, the queue goes direct, so that frees
// reach Go (and wake it) at once, and the frees parked before are applied;
// as it stops, the queue is on again unless another waits.
func oomWait(waiting bool) {
	if !waiting {
		addDirect(-1)
		return
	}
	addDirect(1)
	fqFence()
	drainFrees()
}

// fqFence takes and gives back the ring's lock: what xseg_fq_push did
// under it before is visible after, and a push after sees the direct word
// as it was before (shim.c checks it again under the lock), so no free is
// parked past the drain that follows.
func fqFence() { atomic.StoreInt32(fqLock(&C.xseg_fq), 0) }

// parkFree parks a free as xseg_free does, for tests: false when the ring
// is full or direct.
func parkFree(ptr uint64, dev int) bool { return C.xseg_fq_push(C.uint64_t(ptr), C.int(dev)) != 0 }

// freeAsC frees as xseg_free (shim.c) does, for tests: parked, or through
// Go at once when the queue is full or direct.
func freeAsC(ptr uint64, dev int) {
	if !parkFree(ptr, dev) {
		xsegGoFree(C.uintptr_t(ptr), 0, C.int(dev), 0)
	}
}

// fqTail is the ring's tail: the frees ever parked (it wraps), for tests.
func fqTail() uint32 { return atomic.LoadUint32((*uint32)(unsafe.Pointer(&C.xseg_fq.tail))) }

// rememberBlock and takeBack call xseg_fq_remember and xseg_fq_take_back,
// for tests.
func rememberBlock(ptr, size uint64, dev int, s vmm.Stream, epoch uint32) {
	C.xseg_fq_remember(C.uint64_t(ptr), C.uint64_t(size), C.int(dev), C.uint64_t(s), C.uint32_t(epoch))
}

func takeBack(size uint64, dev int, s vmm.Stream) uint64 {
	return uint64(C.xseg_fq_take_back(C.uint64_t(size), C.int(dev), C.uint64_t(s)))
}

func init() {
	newEpoch()
	lib.onStart = func(releaseThreshold uint64) { setFreesDirect(releaseThreshold > 0) }
	lib.oomWait = oomWait
}
