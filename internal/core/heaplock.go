//go:build !race

package core

import (
	"runtime"
	"sync/atomic"
	"time"
)

// heapLock is the Heap's mutex. A warm Alloc and Free each take it once,
// so its cost is most of theirs: sync.Mutex spends two locked
// instructions on a lock and unlock, heapLock one (the compare-and-swap
// that takes it). It is released by a plain store where the architecture
// orders stores after earlier loads and stores (amd64: releaseStore), and
// by an atomic store elsewhere.
//
// A plain release store cannot also tell, atomically, whether someone
// waits, so a waiter never relies on a wake-up alone: it parks with a
// timeout (wakeFirst, doubling to wakeLast) and tries again, and Unlock
// sends a wake-up whenever it sees a waiter. A wake-up lost to the narrow
// window in which both sides look at once costs a waiter at most one
// timeout, never a deadlock. Unlike sync.Mutex it has no starvation mode:
// a woken waiter competes with new callers for the lock, as it does for
// PyTorch's std::mutex; the Heap holds the lock for short steps, and for
// driver calls that other callers wait out parked. Under the race
// detector, which knows nothing
// of plain release stores, the Heap uses sync.Mutex instead
// (heaplock_race.go).
type heapLock struct {
	state   uint32 // 1 while held; atomic except for releaseStore
	waiters atomic.Int32
	wake    atomic.Pointer[chan struct{}]
}

const (
	// lockSpins is how many times a contended Lock yields and retries
	// before it parks.
	lockSpins = 16
	wakeFirst = 20 * time.Microsecond
	wakeLast  = time.Millisecond
)

// Lock takes the lock.
func (l *heapLock) Lock() {
	if atomic.CompareAndSwapUint32(&l.state, 0, 1) {
		return
	}
	l.lockSlow()
}

// TryLock takes the lock if it is free and reports whether it did.
func (l *heapLock) TryLock() bool {
	return atomic.LoadUint32(&l.state) == 0 && atomic.CompareAndSwapUint32(&l.state, 0, 1)
}

// Unlock releases the lock, which must be held.
func (l *heapLock) Unlock() {
	releaseStore(&l.state, 0)
	if l.waiters.Load() != 0 {
		select {
		case l.wakeChan() <- struct{}{}:
		default:
		}
	}
}

func (l *heapLock) lockSlow() {
	for range lockSpins {
		runtime.Gosched()
		if l.TryLock() {
			return
		}
	}
	l.waiters.Add(1)
	defer l.waiters.Add(-1)
	wake := l.wakeChan()
	d := wakeFirst
	t := time.NewTimer(d)
	defer t.Stop()
	for !l.TryLock() {
		select {
		case <-wake:
		case <-t.C:
			d = min(2*d, wakeLast)
			t.Reset(d)
		}
	}
}

// wakeChan returns the channel Unlock wakes a parked waiter on, making it
// on first use so that the zero heapLock is an unlocked one.
func (l *heapLock) wakeChan() chan struct{} {
	if p := l.wake.Load(); p != nil {
		return *p
	}
	c := make(chan struct{}, 1)
	if l.wake.CompareAndSwap(nil, &c) {
		return c
	}
	return *l.wake.Load()
}
