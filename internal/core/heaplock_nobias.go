//go:build !race && !(linux && amd64)

package core

import "sync/atomic"

// Without Linux's membarrier and amd64's store ordering, heapLock takes
// the shared way only: nothing here is called.
const biasPlatform = false

func lockFast(l *heapLock) {
	if !atomic.CompareAndSwapUint32(&l.state, 0, 1) {
		lockWait(l)
	}
}

func unlockFast(l *heapLock) { unlockShared(l) }

func goroutineID() uintptr { return 0 }
func biasReady() bool      { return false }
func biasOff()             {}
func procBarrier() bool    { return false }
func stopTheWorld()        {}
