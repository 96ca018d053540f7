//go:build !race && linux && amd64

package core

import (
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// biasPlatform says the biased way of heapLock can be used here, given
// membarrier (biasReady).
const biasPlatform = true

// lockFast takes l: the biased way if l is biased to the caller, and
// otherwise (or if that fails) by a compare-and-swap of state from 0 to 1,
// after which it looks at the bias. It jumps to lockWait if the shared
// way is taken, and to lockRevoke if the lock is biased (to another
// goroutine).
//
//go:noescape
func lockFast(l *heapLock)

// unlockFast lets go of l: if it is held the biased way, by clearing
// byBias and busy, and jumping to unlockWake if a revoker waits; else by
// jumping to unlockShared.
//
//go:noescape
func unlockFast(l *heapLock)

// lockRevoke is Lock when it took the shared way of a biased lock. No
// revoker can be waiting: revokers hold the shared way.
//
//lint:ignore U1000 called from assembly
func lockRevoke(l *heapLock) { l.revokeBias() }

// unlockWake is Unlock when a revoker waits for the biased holder.
//
//lint:ignore U1000 called from assembly
func unlockWake(l *heapLock) { l.wakeRevoker() }

// goroutineID is the address of the calling goroutine's g, which names it
// while it lives; a later goroutine may reuse it, and then inherits the
// bias of a dead one, harmlessly.
func goroutineID() uintptr

// membarrier(2)'s commands (linux/membarrier.h).
const (
	mbPrivateExpedited         = 1 << 3
	mbRegisterPrivateExpedited = 1 << 4
)

// barrierState is 0 until biasReady first asks, then barrierOn or
// barrierOff.
var barrierState atomic.Int32

const (
	barrierOn = iota + 1
	barrierOff
)

// membarrierCall is the system call, a variable so that tests can make it
// fail.
var membarrierCall = func(cmd uintptr) error {
	_, _, e := unix.Syscall(unix.SYS_MEMBARRIER, cmd, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// biasReady reports whether locks may be biased: the process registered
// for membarrier's private expedited command, the first time it is asked.
func biasReady() bool {
	switch barrierState.Load() {
	case barrierOn:
		return true
	case barrierOff:
		return false
	}
	st := int32(barrierOff)
	if membarrierCall(mbRegisterPrivateExpedited) == nil {
		st = barrierOn
	}
	barrierState.CompareAndSwap(0, st)
	return barrierState.Load() == barrierOn
}

// biasOff stops further biasing.
func biasOff() { barrierState.Store(barrierOff) }

// procBarrier has every CPU running a thread of the process execute a
// full memory barrier, and reports whether it could.
func procBarrier() bool { return membarrierCall(mbPrivateExpedited) == nil }

// stopTheWorld stops every P and starts them again: ReadMemStats does so
// to read consistent statistics.
func stopTheWorld() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
}
