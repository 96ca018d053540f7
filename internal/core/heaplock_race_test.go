//go:build race

package core

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHeapLockCountsRace: under the race detector the Heap's lock is a
// sync.Mutex, which LockCounts reports as never biased, even after twice
// the run of acquisitions that biases the lock without it (needFirst,
// 64, which this build does not compile).
func TestHeapLockCountsRace(t *testing.T) {
	var h Heap
	for range 2 * 64 {
		h.mu.Lock()
		h.mu.freeSeq++
		h.mu.Unlock()
	}
	biases, revokes := h.LockCounts()
	require.Zero(t, biases)
	require.Zero(t, revokes)
}
