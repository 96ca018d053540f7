package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// allocSlowLocked finds room for rs bytes when the exact-size lists have
// none, following the OOM policy:
//
//  1. best fit among the cached free blocks of the stream;
//  2. new pages (the Backing reuses cached physical pages first);
//  3. on OOM: wait for this stream's pending frees, unmap every whole free
//     page of every segment, release the page cache, retry;
//  4. (final attempts only) wait up to OOMWait for frees by other
//     goroutines, then retry OOMMaxRetries times with exponential backoff
//     from OOMDelay, each delay capped (BackoffDelay) and cut short by
//     Close; not when the memory limit (limit.go) stops the growth, which
//     neither cures;
//  5. fail with an error matching vmm.ErrOutOfMemory.
//
// It releases the lock while it waits or sleeps; an allocation whose tag
// was paused meanwhile fails with ErrPaused, one whose private pool was
// given back with vmm.ErrInvalid (goneLocked).
func (h *Heap) allocSlowLocked(st *state, rs, req uint64, final, long bool) (*block, error) {
	if st.key.private.IsZero() {
		h.touchMarksLocked(st.key.stream)
	}
	var b *block
	var err error
	if long {
		b = h.firstFitLocked(st, rs)
		if hole := h.chainHoleLocked(b, rs); hole != nil {
			// Continue a live block's pages; b goes back to the free
			// blocks, where the growth may take its pages. If the growth
			// fails, the request is placed as any other.
			st.insertFree(b)
			if b, err = h.growIntoLocked(st, hole, hole.prev, rs); err != nil {
				h.log.Debug("xseg: growing after a live block", "err", err)
				b = nil
			}
		}
	}
	if b == nil {
		b, err = h.findLocked(st, rs)
	}
	if !errors.Is(err, vmm.ErrOutOfMemory) {
		return b, wrapAlloc(req, err)
	}
	if h.capturingLocked() {
		// Emptying the cache waits for streams and events: illegal while
		// a stream captures.
		err = fmt.Errorf("%w (a private pool is active, as in a CUDA graph capture: the cache is not emptied)", err)
		return nil, h.oomLocked(st.key.stream, req, 0, final, err)
	}
	h.mu.stats.NumAllocRetries++
	h.logOOM("xseg: out of memory, emptying the cache and retrying", req, err)
	werr := h.waitPendingLocked(func(b *block) bool { return b.seg.Stream == st.key.stream })
	if rerr := errors.Join(werr, h.releaseAllLocked()); rerr != nil {
		h.log.Warn("xseg: emptying the cache after an OOM", "err", rerr)
	}
	retries := 1
	b, err = h.findLocked(st, rs)
	if final && retryable(err) && h.cfg.OOMWait > 0 {
		b, err = h.waitForFreesLocked(st, rs, req)
	}
	for i := 0; final && retryable(err) && i < h.cfg.OOMMaxRetries; i++ {
		delay := BackoffDelay(h.cfg.OOMDelay, i)
		h.mu.stats.NumAllocRetries++
		retries++
		h.logOOM("xseg: out of memory, retrying after a delay", req, err, "delay", delay, "retry", i+1)
		h.sleepUnlocked(delay)
		if err := h.afterWaitLocked(st); err != nil {
			return nil, wrapAlloc(req, err)
		}
		b, err = h.lookAgainLocked(st, rs)
	}
	if errors.Is(err, vmm.ErrOutOfMemory) {
		return nil, h.oomLocked(st.key.stream, req, retries, final, err)
	}
	return b, wrapAlloc(req, err)
}

// maxBackoff caps one delay of the OOM backoff: past a few seconds a
// longer sleep only delays the failure the caller has to handle anyway.
const maxBackoff = 5 * time.Second

// BackoffDelay is the delay before retry i (from 0) of the OOM policy:
// base doubled i times, capped at the smaller of maxBackoff and 50 times
// base. It never overflows, for any i.
func BackoffDelay(base time.Duration, i int) time.Duration {
	if base <= 0 {
		return 0
	}
	limit := maxBackoff
	if base <= maxBackoff/50 {
		limit = 50 * base
	}
	d := base
	for ; i > 0 && d < limit; i-- {
		d *= 2 // d < limit <= maxBackoff: no overflow
	}
	return min(d, limit)
}

// sleepUnlocked releases the lock for delay, or until Close, and takes it
// again. The caller checks h.mu.closed afterwards.
func (h *Heap) sleepUnlocked(delay time.Duration) {
	hook := h.mu.waitHook
	h.mu.Unlock()
	defer h.mu.Lock()
	defer waiting(hook)()
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-h.done:
	}
}

// waitUnlocked releases the lock until ch is closed (a free, Close) or
// timer fires, and reports whether the timer did. The lock is taken again
// however it returns, even if the wait hook panics, so that the caller's
// deferred Unlock stays its own.
func (h *Heap) waitUnlocked(ch <-chan struct{}, timer *time.Timer) (timedOut bool) {
	hook := h.mu.waitHook
	h.mu.Unlock()
	defer h.mu.Lock()
	defer waiting(hook)()
	select {
	case <-ch:
		return false
	case <-timer.C:
		return true
	}
}

// SetOOMWaitHook sets f (nil: none) to be called, without the Heap's
// lock, with true as an allocation begins to wait or sleep in the OOM
// policy (OOMWait, the OOMMaxRetries backoff) and with false as it stops,
// before it looks for room again. It is for a front end that defers
// frees (libxseg's free queue): it must apply them there, and send its
// frees straight to Free until the matching call with false, or the
// allocation would wait for memory already freed. f may call the Heap
// (Free above all); it runs on the waiting goroutine, so it must not wait
// for that allocation.
func (h *Heap) SetOOMWaitHook(f func(waiting bool)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.waitHook = f
}

// waiting calls hook(true) and returns what calls hook(false), for a
// wait of the OOM policy; both do nothing for a nil hook.
func waiting(hook func(bool)) func() {
	if hook == nil {
		return func() {}
	}
	hook(true)
	return func() { hook(false) }
}

// wakeLocked wakes every allocation waiting in the OOM policy, for Close:
// those waiting for frees and those sleeping in the backoff. Safe to call
// more than once.
func (h *Heap) wakeLocked() {
	if h.mu.freed != nil {
		close(h.mu.freed)
		h.mu.freed = nil
	}
	select {
	case <-h.done:
	default:
		close(h.done)
	}
}

// lookAgainLocked looks for room for rs bytes in st after a wait or sleep
// of the OOM policy: first as the heap stands (a block freed meanwhile is
// reused where it is, not unmapped and mapped again), then, if there is
// none, with the cache emptied, as step 3 did before: frees may keep their
// memory where this allocation cannot take it (free blocks of another
// stream or pool, whole free pages, the page cache). Not while a pool is
// active: a capture begun meanwhile forbids the waits and unmaps.
func (h *Heap) lookAgainLocked(st *state, rs uint64) (*block, error) {
	h.pollLocked()
	b, err := h.findLocked(st, rs)
	if !retryable(err) || h.capturingLocked() {
		return b, err
	}
	if rerr := h.releaseAllLocked(); rerr != nil {
		h.log.Warn("xseg: emptying the cache after an OOM", "err", rerr)
	}
	return h.findLocked(st, rs)
}

// afterWaitLocked reports why an allocation of st that released the lock
// to wait or sleep cannot go on: the Heap was closed meanwhile
// (vmm.ErrClosed), or goneLocked's reasons.
func (h *Heap) afterWaitLocked(st *state) error {
	if h.mu.closed {
		return vmm.ErrClosed
	}
	return h.goneLocked(st)
}

// goneLocked reports why st, the state of an allocation that released
// the lock to wait, can no longer be allocated from: its private pool was
// given back meanwhile (its state is in no books: memory growing it would
// never be given back), or it is a tag that was paused (its segments are
// books without pages: a block handed out there would have none behind
// it, a growth would map pages that the tag's Resume maps again).
func (h *Heap) goneLocked(st *state) error {
	if st.key.private.IsZero() {
		return nil
	}
	pp := h.mu.pools[st.key.private]
	if pp == nil || h.mu.states[st.key] != st {
		return fmt.Errorf("pool %v was released while the allocation waited for memory: %w", st.key.private, vmm.ErrInvalid)
	}
	if pp.paused() {
		return fmt.Errorf("tag %q was paused while the allocation waited for memory: %w", pp.tag.name, ErrPaused)
	}
	return nil
}

func wrapAlloc(req uint64, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("allocating %d bytes: %w", req, err)
}

// waitForFreesLocked waits up to OOMWait for blocks freed by other
// goroutines: after each wake it looks for room as the heap stands, and
// only if there is none empties the cache and looks again.
func (h *Heap) waitForFreesLocked(st *state, rs, req uint64) (*block, error) {
	timer := time.NewTimer(h.cfg.OOMWait)
	defer timer.Stop()
	h.logOOM("xseg: out of memory, waiting for frees", req, nil, "wait", h.cfg.OOMWait)
	for {
		if h.mu.freed == nil {
			h.mu.freed = make(chan struct{})
		}
		timedOut := h.waitUnlocked(h.mu.freed, timer)
		if err := h.afterWaitLocked(st); err != nil {
			return nil, err // allocSlowLocked's wrapAlloc names the request
		}
		b, err := h.lookAgainLocked(st, rs)
		if err == nil || timedOut || !retryable(err) {
			return b, err
		}
	}
}

// oomLocked counts an OOM and builds the error of the OOM policy.
func (h *Heap) oomLocked(s vmm.Stream, req uint64, retries int, final bool, cause error) error {
	if !final {
		return fmt.Errorf("allocating %d bytes: %w", req, cause)
	}
	h.mu.stats.NumOOMs++
	// A failed grow leaves the pages it made in the cache: give them back.
	if err := h.releaseCacheLocked(); err != nil {
		h.log.Warn("xseg: after an OOM", "err", err)
	}
	free, total, merr := h.drv.MemInfo(h.dev)
	dev := fmt.Sprintf("%d bytes free of %d on device %d", free, total, h.dev)
	if merr != nil {
		dev = fmt.Sprintf("free memory of device %d unknown (%v)", h.dev, merr)
	}
	if h.mu.hist != nil {
		h.noteOOMLocked(req, s, free)
	}
	st := h.statsLocked()
	err := fmt.Errorf("allocating %d bytes on stream %#x: out of memory after %s: %s; this allocator reserves %d bytes and has %d allocated: %w",
		req, uintptr(s), retriesText(retries), dev, st.ReservedBytes.All.Current, st.AllocatedBytes.All.Current, cause)
	level := slog.LevelDebug
	if h.cfg.OOMVerbose {
		level = slog.LevelWarn
	}
	h.log.Log(context.Background(), level, "xseg: out of memory", "err", err)
	return err
}

// tooLargeLocked fails a request no device memory could ever hold.
func (h *Heap) tooLargeLocked(size uint64, s vmm.Stream, final bool) error {
	if final {
		h.mu.stats.NumOOMs++
		if h.mu.hist != nil {
			free, _, _ := h.drv.MemInfo(h.dev)
			h.noteOOMLocked(size, s, free)
		}
	}
	return fmt.Errorf("allocating %d bytes: more than the device's %d bytes, 0 retries: %w", size, h.limit, vmm.ErrOutOfMemory)
}

func (h *Heap) logOOM(msg string, req uint64, err error, args ...any) {
	level := slog.LevelDebug
	if h.cfg.OOMVerbose {
		level = slog.LevelInfo
	}
	args = append(args, "size", req, "reserved", h.mu.stats.ReservedBytes.All.Current, "allocated", h.mu.bstats.allCurrent()[hAllocBytes])
	if err != nil {
		args = append(args, "err", err)
	}
	h.log.Log(context.Background(), level, msg, args...)
}

// maxShrinks bounds the attempts of AllocAtMost below max: each shrinks
// the request by at least 1/maxShrinks of max, however close to 1 the size
// factor is, since every failed attempt empties the cache.
const maxShrinks = 64

// AllocAtMost returns the largest block it can get of at most max and at
// least min bytes, and its size: it tries max, or the most there is room
// for if that is less (atMostRoom), then shrinks the request by the
// configured size factor, by at least a 64th of the first try and one
// small page a step, down to min; at most 65 attempts. Only the attempt at
// min runs the whole OOM policy (waits and retries).
func (h *Heap) AllocAtMost(max, min uint64, s vmm.Stream) (vmm.DevicePtr, uint64, error) {
	if min == 0 || min > max {
		return 0, 0, fmt.Errorf("allocating between %d and %d bytes: %w", min, max, vmm.ErrInvalid)
	}
	size := max
	if room := h.atMostRoom() &^ (MinBlock - 1); room < size {
		size = room // below min, the first try is min's
	}
	step := h.minShrink(size)
	for {
		final := size <= min
		if final {
			size = min
		}
		ptr, err := h.alloc(size, s, final)
		if err == nil || final || !errors.Is(err, vmm.ErrOutOfMemory) {
			return ptr, size, err
		}
		size = h.shrink(size, step)
	}
}

// atMostRoom is the most any one block could have now: the device's free
// memory and the bytes the Heap holds mapped but not in use, within the
// memory limit if one is set; the largest value when the driver cannot
// say. Starting there, AllocAtMost does not spend its attempts on sizes no
// device could give (a max of 1 TiB on an 80 GiB card).
func (h *Heap) atMostRoom() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	free, _, err := h.drv.MemInfo(h.dev)
	if err != nil {
		return math.MaxUint64
	}
	reserved := uint64(max(0, h.mu.stats.ReservedBytes.All.Current))
	idle := reserved - min(reserved, uint64(max(0, h.mu.bstats.allCurrent()[hActiveBytes])))
	room := free + idle
	if room < free {
		room = math.MaxUint64
	}
	if lim := h.mu.memLimit; lim.on {
		room = min(room, lim.bytes-min(lim.bytes, reserved)+idle)
	}
	return room
}

// minShrink is the least step of AllocAtMost from max: max/maxShrinks
// rounded up, and at least a small page (a smaller step rarely changes how
// many pages the request needs).
func (h *Heap) minShrink(top uint64) uint64 {
	return RoundSize(max(top/maxShrinks+1, h.cfg.SmallPageSize))
}

// shrink is the next, smaller request of AllocAtMost after size failed:
// size times the size factor, or size less step if that is smaller,
// rounded down to MinBlock; 0 when nothing is left.
func (h *Heap) shrink(size, step uint64) uint64 {
	if size <= step {
		return 0
	}
	next := min(uint64(float64(size)*h.cfg.OOMSizeFactor), size-step)
	return next &^ (MinBlock - 1)
}

// retriesText is "1 retry" or "N retries".
func retriesText(n int) string {
	if n == 1 {
		return "1 retry"
	}
	return fmt.Sprintf("%d retries", n)
}
