package core

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHeapLockExcludes has goroutines add to a plain counter under the
// lock, some holding it across a sleep so that others park: every
// increment lands and every goroutine gets through.
func TestHeapLockExcludes(t *testing.T) {
	var l heapLock
	const workers, rounds = 8, 5000
	n := 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				l.Lock()
				v := n
				if w == 0 && i%500 == 0 {
					time.Sleep(200 * time.Microsecond) // make the others park
				}
				n = v + 1
				l.Unlock()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("goroutines still waiting for the lock after a minute")
	}
	require.Equal(t, workers*rounds, n)
}

// TestHeapLockLongHold: a goroutine waiting while the holder sleeps gets
// the lock only after it is released, and soon after.
func TestHeapLockLongHold(t *testing.T) {
	var l heapLock
	l.Lock()
	require.False(t, l.TryLock())
	got := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Lock()
		got <- time.Now()
		l.Unlock()
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("a waiter got the lock while it was held")
	default:
	}
	released := time.Now()
	l.Unlock()
	at := <-got
	require.False(t, at.Before(released))
	require.Less(t, at.Sub(released), time.Second)
	<-done // the waiter has unlocked
	require.True(t, l.TryLock())
	l.Unlock()
}

// BenchmarkHeapLockPair takes and releases the Heap's lock twice, as a
// warm Alloc and Free each do once, from one goroutine: after the first
// needFirst pairs the biased way where there is one (Linux on amd64), the
// compare-and-swap elsewhere. It is the lock's share of expandable's
// BenchmarkAllocFreeCached (bench/RESULTS.md compares the two in one run
// on the GPU machine's CPU).
func BenchmarkHeapLockPair(b *testing.B) {
	var h Heap
	for b.Loop() {
		h.mu.Lock()
		h.mu.freeSeq++ // a word under the lock, as Alloc's counters are
		h.mu.heapLock.Unlock()
		h.mu.Lock()
		h.mu.freeSeq++
		h.mu.heapLock.Unlock()
	}
	require.Equal(b, uint64(2*b.N), h.mu.freeSeq)
}
