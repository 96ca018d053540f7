//go:build !race

package core

import (
	"runtime"
	"sync/atomic"
	"time"
)

// heapLock is the Heap's mutex. A warm Alloc and Free each take it once,
// so its cost is most of theirs. It has two ways in.
//
// The shared way is a compare-and-swap on state, the one locked
// instruction of a lock and unlock (sync.Mutex spends two): it is released
// by a plain store where the architecture orders stores after earlier
// loads and stores (amd64: releaseStore), and by an atomic store
// elsewhere. A plain release store cannot also tell, atomically, whether
// someone waits, so a waiter never relies on a wake-up alone: it parks
// with a timeout (wakeFirst, doubling to wakeLast) and tries again, and
// Unlock sends a wake-up whenever it sees a waiter. A wake-up lost to the
// narrow window in which both sides look at once costs a waiter at most
// one timeout, never a deadlock. Unlike sync.Mutex it has no starvation
// mode: a woken waiter competes with new callers for the lock, as it does
// for PyTorch's std::mutex.
//
// The biased way has no locked instruction at all. Most programs call the
// allocator from one goroutine, or one C thread, at a time. After a run of
// shared acquisitions by one goroutine with nobody parked (need of them),
// it biases the lock to itself as it lets go: bias points to a new
// biasRec naming it. That goroutine then takes the lock by a plain store
// of 1 to the record's busy, after which it checks that revoke is still 0
// and bias still the record; it lets go by a plain store of 0. Anyone else
// takes the shared way and then revokes the bias (revokeBias): it sets
// revoke, has every CPU running a thread of the process execute a full
// barrier (membarrier(2); procBarrier), waits for the record's busy to be
// 0 and clears bias. The barrier is what makes the plain store safe: a
// biased taker's check of revoke either comes after the barrier, and sees
// it set, or before it, and then its store of busy is visible once the
// barrier returns. This is the asymmetric form of Dekker's handshake that
// user-space RCU and folly's hazard pointers use: the rare side pays for
// the fence that the frequent side leaves out. A record serves one bias
// only, so that a taker held up between its look at bias and its store
// to busy, for as long as the OS likes, writes to a record nobody waits on
// any more. A revocation costs a system call and a wait, so each one
// doubles need (to needLast): goroutines taking turns settle on the shared
// way.
//
// The bias is used only on Linux on amd64 (the store ordering, and the
// system call), where membarrier's private expedited command registers
// (biasReady); lockFast and unlockFast, in assembly there, take the warm
// paths of both ways in one call. Under the race detector, which knows
// nothing of plain release stores, the Heap uses sync.Mutex instead
// (heaplock_race.go).
type heapLock struct {
	state   uint32 // 1 while held the shared way; atomic except for releaseStore
	waiters atomic.Int32
	wake    atomic.Pointer[chan struct{}]

	bias   atomic.Pointer[biasRec] // set by a shared holder as it lets go
	revoke uint32                  // 1 while a shared holder takes the bias back; atomic
	// unbias is where a biased holder that sees revoke wakes the revoker.
	unbias atomic.Pointer[chan struct{}]

	// The rest is the holder's, written only under the lock.
	byBias  bool    // the holder took the biased way
	runG    uintptr // the goroutine of the last shared acquisitions
	run     uint32  // how many of them in a row
	need    uint32  // the run that biases the lock; 0 stands for needFirst
	revokes uint64  // revocations so far
	biases  uint64  // biasings so far
}

// biasRec is one bias of a heapLock.
type biasRec struct {
	owner uintptr // the goroutine it is biased to (goroutineID)
	busy  uint32  // 1 while held, or being tried, the biased way; atomic loads, plain stores
}

const (
	// lockSpins is how many times a contended Lock yields and retries
	// before it parks.
	lockSpins = 16
	wakeFirst = 20 * time.Microsecond
	wakeLast  = time.Millisecond

	// needFirst is the run of shared acquisitions by one goroutine that
	// first biases a lock; each revocation doubles it, up to needLast.
	needFirst = 64
	needLast  = 1 << 20
)

// Lock takes the lock.
func (l *heapLock) Lock() { lockFast(l) }

// Unlock releases the lock, which must be held.
func (l *heapLock) Unlock() { unlockFast(l) }

// Lock and Unlock are one call each, to lockFast and unlockFast, which
// take the warm paths and jump to the functions below for the rest.

// lockWait is Lock when the shared way is taken.
//
//lint:ignore U1000 called from assembly on linux/amd64
func lockWait(l *heapLock) {
	if atomic.LoadUint32(&l.revoke) != 0 {
		l.wakeRevoker() // lockFast may have tried the biased way
	}
	l.lockSlow()
	if l.bias.Load() != nil {
		l.revokeBias()
	}
}

// unlockShared releases the shared way, biasing the lock first if its
// holder has taken it often enough in a row.
//
//lint:ignore U1000 called from assembly on linux/amd64
func unlockShared(l *heapLock) {
	if biasPlatform {
		l.noteRun()
	}
	l.releaseShared()
}

// TryLock takes the lock the shared way if nobody holds it, and reports
// whether it did.
func (l *heapLock) TryLock() bool {
	if !l.tryShared() {
		return false
	}
	if r := l.bias.Load(); r != nil {
		if atomic.LoadUint32(&r.busy) != 0 {
			l.releaseShared()
			return false
		}
		l.revokeBias()
	}
	return true
}

// tryShared takes the shared way if it is free.
func (l *heapLock) tryShared() bool {
	return atomic.LoadUint32(&l.state) == 0 && atomic.CompareAndSwapUint32(&l.state, 0, 1)
}

func (l *heapLock) releaseShared() {
	releaseStore(&l.state, 0)
	if l.waiters.Load() != 0 {
		select {
		case l.wakeChan() <- struct{}{}:
		default:
		}
	}
}

// noteRun counts a shared holder's acquisition towards the run of its
// goroutine, and biases the lock to that goroutine when the run reaches
// need. It runs as the holder lets go: only the holder itself can take the
// biased way, and it is done with what the lock guards.
func (l *heapLock) noteRun() {
	if l.waiters.Load() != 0 {
		l.run = 0
		return
	}
	me := goroutineID()
	if me != l.runG {
		l.runG, l.run = me, 0
	}
	l.run++
	need := l.need
	if need == 0 {
		need = needFirst
	}
	if l.run >= need && biasReady() {
		l.run = 0
		l.biases++
		l.bias.Store(&biasRec{owner: me})
	}
}

// revokeBias takes the bias back; the caller holds the shared way. It
// waits for a biased holder to let go.
func (l *heapLock) revokeBias() {
	r := l.bias.Load() // only a shared holder changes it: this one
	atomic.StoreUint32(&l.revoke, 1)
	if !procBarrier() {
		// membarrier failed after it registered, which the kernel does
		// not do. Stop the world instead: no P stops while one of its
		// goroutines runs the assembly of lockFast, and each stopped P
		// has passed a locked instruction, so a biased taker's store is
		// visible after it as after the barrier. No more biasing.
		stopTheWorld()
		biasOff()
	}
	spinThenPark(func() bool { return atomic.LoadUint32(&r.busy) == 0 }, l.unbiasChan(), nil)
	l.bias.Store(nil)
	atomic.StoreUint32(&l.revoke, 0)
	l.need = min(2*max(l.need, needFirst), needLast)
	l.run = 0
	l.revokes++
}

// wakeRevoker wakes a revoker waiting for busy to be 0, if one parks.
func (l *heapLock) wakeRevoker() {
	select {
	case l.unbiasChan() <- struct{}{}:
	default:
	}
}

func (l *heapLock) lockSlow() { spinThenPark(l.tryShared, l.wakeChan(), &l.waiters) }

// spinThenPark returns once ready reports true. It yields and asks again
// lockSpins times, then parks: counted in parked while it does, woken by
// wake or by a timeout that doubles from wakeFirst to wakeLast, as a
// wake-up can be lost (heapLock).
func spinThenPark(ready func() bool, wake <-chan struct{}, parked *atomic.Int32) {
	for range lockSpins {
		if ready() {
			return
		}
		runtime.Gosched()
	}
	if parked != nil {
		parked.Add(1)
		defer parked.Add(-1)
	}
	d := wakeFirst
	t := time.NewTimer(d)
	defer t.Stop()
	for !ready() {
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
func (l *heapLock) wakeChan() chan struct{} { return lazyChan(&l.wake) }

// unbiasChan returns the channel a biased holder wakes a revoker on.
func (l *heapLock) unbiasChan() chan struct{} { return lazyChan(&l.unbias) }

func lazyChan(p *atomic.Pointer[chan struct{}]) chan struct{} {
	if c := p.Load(); c != nil {
		return *c
	}
	c := make(chan struct{}, 1)
	if p.CompareAndSwap(nil, &c) {
		return c
	}
	return *p.Load()
}

// counts returns how many times the lock was biased and how many times a
// bias was revoked; the caller holds the lock.
func (l *heapLock) counts() (biases, revokes uint64) { return l.biases, l.revokes }
