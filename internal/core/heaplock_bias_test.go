//go:build !race

package core

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// canBias reports whether heapLock's biased way is available here; on
// Linux on amd64 it must be, or the tests below would prove nothing.
func canBias(t *testing.T) bool {
	if !biasPlatform {
		require.False(t, biasReady())
		return false
	}
	require.True(t, biasReady(), "membarrier's private expedited command did not register")
	return true
}

// lockRun takes and releases l n times from the calling goroutine and
// returns how many of those took the biased way.
func lockRun(l *heapLock, n int) int {
	biased := 0
	for range n {
		l.Lock()
		if l.byBias {
			biased++
		}
		l.Unlock()
	}
	return biased
}

// TestHeapLockBiases: a goroutine that takes the lock needFirst times in a
// row biases it, and takes every later one the biased way.
func TestHeapLockBiases(t *testing.T) {
	var l heapLock
	if !canBias(t) {
		require.Zero(t, lockRun(&l, 1000))
		return
	}
	runtime.LockOSThread() // keep other work off the goroutine's thread
	defer runtime.UnlockOSThread()
	require.Zero(t, lockRun(&l, needFirst-1))
	require.Zero(t, l.biases)
	require.Zero(t, lockRun(&l, 1)) // the needFirst-th biases as it lets go
	require.Equal(t, uint64(1), l.biases)
	require.Equal(t, goroutineID(), l.bias.Load().owner)
	require.Equal(t, 1000, lockRun(&l, 1000))
	require.Zero(t, l.revokes)
	require.Zero(t, atomic.LoadUint32(&l.bias.Load().busy))
	require.Zero(t, atomic.LoadUint32(&l.state))
}

// TestGoroutineID: the same in one goroutine, different in two that live
// at once.
func TestGoroutineID(t *testing.T) {
	me := goroutineID()
	require.Equal(t, me, goroutineID())
	other := make(chan uintptr)
	hold := make(chan struct{})
	go func() { other <- goroutineID(); <-hold }()
	o := <-other
	close(hold)
	if biasPlatform {
		require.NotZero(t, me)
		require.NotEqual(t, me, o)
	}
}

// TestHeapLockRevoke: a goroutine biases the lock and holds it the biased
// way; another one's Lock waits until it lets go, revokes the bias and
// doubles the run needed to bias again.
func TestHeapLockRevoke(t *testing.T) {
	var l heapLock
	if !canBias(t) {
		t.Skip("no biased way on this platform")
	}
	n := 0 // guarded by l
	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		lockRun(&l, needFirst)
		l.Lock()
		if !l.byBias {
			t.Error("the biased goroutine took the shared way")
		}
		close(held)
		<-release
		n++
		l.Unlock()
	}()
	<-held
	got := make(chan struct{})
	go func() {
		l.Lock()
		n++
		close(got)
		l.Unlock()
	}()
	select {
	case <-got:
		t.Fatal("Lock returned while the lock was held the biased way")
	case <-time.After(30 * time.Millisecond):
	}
	require.False(t, l.TryLock())
	close(release)
	<-done
	<-got
	l.Lock()
	defer l.Unlock()
	require.False(t, l.byBias)
	require.Equal(t, 2, n)
	require.Equal(t, uint64(1), l.revokes)
	require.Equal(t, uint32(2*needFirst), l.need)
	require.Nil(t, l.bias.Load())
	require.Zero(t, atomic.LoadUint32(&l.revoke))
}

// TestHeapLockTryLockRevokes: TryLock from another goroutine takes a lock
// biased to a goroutine that does not hold it, revoking the bias.
func TestHeapLockTryLockRevokes(t *testing.T) {
	var l heapLock
	if !canBias(t) {
		t.Skip("no biased way on this platform")
	}
	done := make(chan struct{})
	go func() { defer close(done); lockRun(&l, needFirst) }()
	<-done
	require.NotNil(t, l.bias.Load())
	require.True(t, l.TryLock())
	require.False(t, l.byBias)
	require.Nil(t, l.bias.Load())
	require.Equal(t, uint64(1), l.revokes)
	l.Unlock()
}

// stressLock has workers goroutines take l in bursts, long enough for
// each to bias it, checking that no two are ever inside at once and that
// every increment of a plain counter lands; some yield inside. The first
// worker starts alone, with a run that biases the lock if it can be. It
// returns how many acquisitions took the biased way.
func stressLock(t *testing.T, l *heapLock, workers, bursts int) int {
	var inside atomic.Int32
	n, biased := 0, 0
	burst := 4 * needFirst
	start := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			if w == 0 {
				for range needFirst + 1 {
					l.Lock()
					if l.byBias {
						biased++
					}
					n++
					l.Unlock()
				}
				close(start)
			}
			<-start
			for b := range bursts {
				for i := range burst {
					l.Lock()
					if inside.Add(1) != 1 {
						t.Error("two goroutines hold the lock")
					}
					if l.byBias {
						biased++
					}
					v := n
					if (w+b+i)%97 == 0 {
						runtime.Gosched() // let another try meanwhile
					}
					n = v + 1
					inside.Add(-1)
					l.Unlock()
				}
				runtime.Gosched()
			}
		})
	}
	wait(t, &wg)
	require.Equal(t, workers*bursts*burst+needFirst+1, n)
	if r := l.bias.Load(); r != nil {
		require.Zero(t, atomic.LoadUint32(&r.busy))
	}
	require.Zero(t, atomic.LoadUint32(&l.state))
	return biased
}

func wait(t *testing.T, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("goroutines still waiting for the lock after two minutes")
	}
}

// TestHeapLockBiasStress: goroutines taking turns in bursts, with one P
// and with several, keep the lock exclusive through biasings and
// revocations, and both happen.
func TestHeapLockBiasStress(t *testing.T) {
	for _, procs := range []int{1, 4} {
		t.Run(map[int]string{1: "one P", 4: "four Ps"}[procs], func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			var l heapLock
			biased := stressLock(t, &l, 4, 20)
			if canBias(t) {
				require.NotZero(t, biased)
				require.NotZero(t, l.biases)
				require.NotZero(t, l.revokes)
				require.GreaterOrEqual(t, l.need, uint32(2*needFirst))
			} else {
				require.Zero(t, biased)
			}
		})
	}
}

// TestHeapLockBiasHandoff: the bias passes between goroutines whose
// owner is parked (blocked on a channel, not holding the lock) or has
// exited, and new goroutines (which may reuse an exited one's g) take the
// lock, biased or not, without deadlock; every acquisition is counted.
func TestHeapLockBiasHandoff(t *testing.T) {
	var l heapLock
	bias := canBias(t)
	n := 0 // guarded by l
	run := func(k int) {
		for range k {
			l.Lock()
			n++
			l.Unlock()
		}
	}
	park, resume, parked := make(chan struct{}), make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(needFirst + 1) // biased to this goroutine
		close(parked)
		<-park // parked, owning the bias
		run(1) // revokes the bias the other goroutine took meanwhile
		close(resume)
	}()
	<-parked
	if bias {
		require.NotNil(t, l.bias.Load())
	}
	run(4*needFirst + 1) // revokes the parked owner's bias, biases to this one
	close(park)
	<-resume
	<-done
	var wg sync.WaitGroup
	for range 8 { // short-lived goroutines, some on exited ones' g
		wg.Go(func() { run(needFirst + 3) })
		wg.Wait()
	}
	for range 4 {
		wg.Go(func() { run(3 * needFirst) })
	}
	wait(t, &wg)
	l.Lock()
	defer l.Unlock()
	require.Equal(t, (needFirst+1)+(4*needFirst+1)+1+8*(needFirst+3)+4*3*needFirst, n)
	if bias {
		require.NotZero(t, l.revokes)
		require.NotZero(t, l.biases)
	}
	require.Zero(t, atomic.LoadUint32(&l.revoke))
}

// TestHeapLockCounts: Heap.LockCounts tells a biased lock from one taken
// back. One goroutine takes a Heap's lock needFirst times and biases it;
// another goroutine's Lock revokes the bias.
func TestHeapLockCounts(t *testing.T) {
	var h Heap
	biases, revokes := h.LockCounts()
	require.Zero(t, biases)
	require.Zero(t, revokes)
	if !canBias(t) {
		lockRun(&h.mu.heapLock, 2*needFirst)
		biases, revokes = h.LockCounts()
		require.Zero(t, biases)
		require.Zero(t, revokes)
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lockRun(&h.mu.heapLock, needFirst)
	biases, revokes = h.LockCounts() // taken the biased way
	require.Equal(t, uint64(1), biases)
	require.Zero(t, revokes)
	done := make(chan [2]uint64)
	go func() {
		b, r := h.LockCounts()
		done <- [2]uint64{b, r}
	}()
	require.Equal(t, [2]uint64{1, 1}, <-done)
}
