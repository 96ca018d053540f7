//go:build !race

package core

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// failBarrier makes membarrier's barrier command fail (its registration
// too, if registerToo), for the rest of the test.
func failBarrier(t *testing.T, registerToo bool) {
	old := membarrierCall
	membarrierCall = func(cmd uintptr) error {
		if cmd == mbRegisterPrivateExpedited && !registerToo {
			return old(cmd)
		}
		return syscall.EPERM
	}
	barrierState.Store(0)
	t.Cleanup(func() {
		membarrierCall = old
		barrierState.Store(0)
	})
}

// TestHeapLockBarrierFails: if membarrier fails when a bias is revoked,
// the revoker stops the world instead, and nothing is biased again; the
// lock stays exclusive.
func TestHeapLockBarrierFails(t *testing.T) {
	failBarrier(t, false)
	var l heapLock
	stressLock(t, &l, 4, 10)
	require.Equal(t, uint64(1), l.biases)
	require.Equal(t, uint64(1), l.revokes)
	require.False(t, biasReady())
	require.Zero(t, lockRun(&l, 4*needFirst))
}

// TestHeapLockNoBarrier: where membarrier does not register, the lock is
// never biased.
func TestHeapLockNoBarrier(t *testing.T) {
	failBarrier(t, true)
	var l heapLock
	require.Zero(t, stressLock(t, &l, 2, 5))
	require.Zero(t, l.biases)
	require.False(t, biasReady())
}
