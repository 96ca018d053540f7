package core

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"slices"

	"github.com/google/btree"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// Heap is the block core of one device: it hands out blocks from the
// segments a Backing supplies, keeps freed blocks for reuse per (stream,
// pool), follows the OOM policy and keeps the statistics. Its methods are
// those of the root package's Allocator interface, which the allocators
// built on it expose.
//
// A Heap is safe for concurrent use by multiple goroutines: one mutex
// guards it and is held for the length of a call, except while the OOM
// policy sleeps or waits for frees.
//
// The warm paths of Alloc and Free touch few cache lines, which counts
// where another thread on the same core evicts them (the GPU machines'
// CPUs run other tenants' threads on the sibling of each core): the
// inputs they read first, then the lock and their state in heapMu, then
// the block counters, each in lines of their own. The Go runtime starts
// a Heap 8 bytes into a line (past its allocation header), so the
// struct's lines start at offsets 56, 120, ...; TestHotLayout checks
// the lines at the addresses the runtime gives.
type Heap struct {
	// The warm paths' inputs, fixed by NewHeap, in the first cache line
	// (56 bytes of it).
	limit uint64 // no request above this can ever succeed
	// poolMax is, for each pool but the last, the largest request
	// (rounded) it takes: Config.PoolClasses' MaxRequest.
	poolMax [NumPools - 1]uint64
	// classPage is, by pool, the page size classOf divides a request by
	// under Config.SizeClasses; 0 without it.
	classPage [NumPools]uint64
	// packFrom is, by pool, the page size under Config.PackLongLived
	// (pack.go): the smallest request predicted; without it,
	// math.MaxUint64 (none).
	packFrom [NumPools]uint64
	whole    bool    // Config.WholePages
	_        [7]byte // heapMu starts the next line (TestHotLayout)

	mu heapMu

	drv  vmm.Driver
	dev  vmm.Device
	back Backing
	cfg  Config
	log  *slog.Logger
	// release is the Backing's ReleasePolicy (the zero value if it has
	// none).
	release ReleasePolicy
	// classes are cfg's shared pools (Config.PoolClasses), in Pool
	// order.
	classes [NumPools]spec.PoolClass
	// donors are, by pool, the smaller pools whose free pages a growth of
	// the pool may take (grow.go); mates are all its page mates.
	donors, mates [NumPools][]Pool
	// bounds is the Backing as an AllocBounder under Config.ChunkBytes,
	// else nil; every segment gets it (Seg.bounds).
	bounds AllocBounder
	// holder is the Backing as a PageHolder under Config.RecyclePages,
	// else nil.
	holder PageHolder
	// retirer is the Backing as a PageRetirer under Config.RecyclePages,
	// else nil.
	retirer PageRetirer
	// done is closed by Close (under mu, see wakeLocked): an allocation
	// sleeping in the OOM backoff, without the lock, wakes on it.
	done chan struct{}
}

// heapMu is what Heap's lock guards, with the lock. Its Unlock works out
// quiet and plain, the warm paths' conditions, afresh; the warm paths,
// which change none of their inputs, let go by heapLock's own Unlock.
type heapMu struct {
	heapLock // its warm fields in the Heap's second line (heaplock.go)
	// The rest of the warm paths' state: the third line, then packing
	// and the states of class 0 in the fourth.
	closed bool
	// quiet: an Alloc can take a parked block at once (warmAllocLocked);
	// plain: a Free of a block of a shared pool, used on its stream only,
	// takes the warm path (plainFreeLocked).
	quiet, plain bool
	// noWarm turns both warm paths off (SetWarmPaths), for the tests
	// that hold them to the general path's results.
	noWarm bool
	trims  bool // Config.ReleaseThreshold is set
	// shape changes whenever the blocks may have changed other than by
	// the warm paths: at every Unlock, and when a Free coalesces. A block
	// seen isolated at a shape stays so until it changes (popExact).
	shape uint64
	// lastStream is the stream Alloc saw last (see streams).
	lastStream vmm.Stream
	// freeSeq numbers the frees (block.freed); marks are the
	// streams' marks (marks.go).
	freeSeq uint64
	// freed, when not nil, is closed by the next free (an allocation
	// waiting in the OOM policy for frees).
	freed chan struct{}
	hist  *history // the allocation history, nil while off (history.go)
	pack  packer   // Config.PackLongLived (pack.go)
	// def are the states of stream 0, by size class and pool: those of
	// class 0, all a Heap without Config.SizeClasses uses, first.
	def [numClasses][NumPools]*state
	// Then the block counters, from a line of their own: each pool's
	// warm counters fill one line (hotstats.go).
	spare *block // recycled block structs, through next
	// chunkMark is the most ReservedBytes has been since the Heap was
	// made or last emptied: chunks are made only past it (grow.go).
	chunkMark uint64
	states    map[stateKey]*state
	blocks    map[vmm.DevicePtr]*block
	bstats    blockStats
	// handed caches blocks handed out by a hash of their ptr, so that
	// Free finds a block without the map (blockLocked).
	handed [1 << handedBits]*block
	nodes  *btree.FreeListG[*block]
	// stats are the statistics but for those of blocks, which
	// bstats keeps (hotstats.go): read them with statsLocked.
	stats  Stats
	mapped [NumPools]uint64 // bytes mapped, by pool
	marks  map[vmm.Stream]*streamMark
	// retiring are the segments with retired runs (retire.go).
	retiring []*Seg
	pending  []pendingEvent
	events   []vmm.Event    // recorded and completed, for reuse
	pins     map[*block]int // pin counts of shared blocks (pin.go)
	// streams are the streams the driver has confirmed live
	// (streams.go): a stream is checked once, not on every allocation.
	streams map[vmm.Stream]struct{}
	// Private pools (pools.go): every pool by id, the active routes
	// in the order begun, and the frees deferred while one is active.
	pools    map[PoolID]*privatePool
	routes   []route
	deferred []*block
	// shared are the states of the shared pools (never of a private
	// pool; none is ever deleted) in donorOrder, kept so, for the
	// donors of a growth (grow.go) without a sort on every growth.
	shared []*state
	// waitHook is SetOOMWaitHook's function, nil when none.
	waitHook func(waiting bool)
	// tags are the pools of tags by name, nextTag the number of the
	// next one's id (tags.go).
	tags     map[string]*privatePool
	nextTag  uint64
	memLimit memLimit // the cap on reserved bytes (limit.go)
	// trimFloor is, under ReleasePolicy.WholeSegments, the free bytes
	// over the threshold that the last release left (release.go).
	trimFloor uint64
}

// Unlock releases the lock, working out quiet and plain for the next
// holder.
func (m *heapMu) Unlock() {
	m.settle()
	m.heapLock.Unlock()
}

// settle works out quiet and plain, and moves the shape on.
func (m *heapMu) settle() {
	m.quiet, m.plain = m.quietNow(), m.plainNow()
	m.shape++
}

// quietNow is what quiet stands for: the Heap is open, and no route,
// deferred free or pending event asks an allocation for work first.
func (m *heapMu) quietNow() bool {
	return !m.closed && !m.noWarm && len(m.routes) == 0 && len(m.deferred) == 0 && len(m.pending) == 0
}

// plainNow is what plain stands for: the Heap is open, with no history,
// pins, route or release threshold for a free to mind.
func (m *heapMu) plainNow() bool {
	return !m.closed && !m.noWarm && m.hist == nil && len(m.pins) == 0 && len(m.routes) == 0 && !m.trims
}

// SetWarmPaths turns the warm paths of Alloc and Free on (as a Heap
// starts) or off. Off, every call takes the general path, which the
// warm paths must match in all they leave behind: for tests.
func (h *Heap) SetWarmPaths(on bool) {
	h.mu.Lock()
	h.mu.noWarm = !on
	h.mu.Unlock()
}

// handedBits is log2 of the slots of Heap.mu.handed.
const handedBits = 8

// NewHeap makes a Heap that allocates on device dev of d from segments b
// supplies. limit is the device's total memory: a request above it fails at
// once. log may be nil.
func NewHeap(d vmm.Driver, dev vmm.Device, b Backing, cfg Config, limit uint64, log *slog.Logger) (*Heap, error) {
	if err := cfg.Validate(); err != nil {
		if !errors.Is(err, vmm.ErrInvalid) {
			err = fmt.Errorf("%w: %w", err, vmm.ErrInvalid)
		}
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Heap{drv: d, dev: dev, back: b, cfg: cfg, limit: limit, log: log, done: make(chan struct{})}
	h.mu.trims = cfg.ReleaseThreshold > 0
	h.classes = cfg.PoolClasses()
	for i, c := range h.classes {
		if c.Pool != Pool(i) {
			panic(fmt.Sprintf("xseg: pool class %d is of pool %v", i, c.Pool))
		}
		if i < NumPools-1 {
			h.poolMax[i] = c.MaxRequest
		}
	}
	h.whole = cfg.WholePages
	for _, p := range spec.Pools() {
		h.mates[p] = cfg.PageMates(p)
		for _, q := range h.mates[p] {
			if q < p {
				h.donors[p] = append(h.donors[p], q)
			}
		}
	}
	if rp, ok := b.(ReleasePolicer); ok {
		h.release = rp.ReleasePolicy()
	}
	if ph, ok := b.(PageHolder); ok && cfg.RecyclePages {
		h.holder = ph
	}
	if pr, ok := b.(PageRetirer); ok && h.holder != nil {
		h.retirer = pr
	}
	if ab, ok := b.(AllocBounder); ok && cfg.ChunkBytes > 0 {
		h.bounds = ab
	}
	h.mu.states = make(map[stateKey]*state)
	h.mu.blocks = make(map[vmm.DevicePtr]*block)
	h.mu.nodes = btree.NewFreeListG[*block](1024)
	if cfg.SizeClasses {
		for _, p := range spec.Pools() {
			h.classPage[p] = h.classes[p].PageSize
		}
	}
	for _, p := range spec.Pools() {
		h.packFrom[p] = math.MaxUint64
		if cfg.PackLongLived {
			h.packFrom[p] = h.classes[p].PageSize
		}
	}
	for _, p := range spec.Pools() {
		h.mu.def[0][p] = h.stateLocked(0, p, 0)
	}
	h.mu.settle()
	return h, nil
}

// Config returns the configuration the Heap runs with.
func (h *Heap) Config() Config { return h.cfg }

// PoolOf returns the pool of a request of size bytes (rounded).
// wholePages rounds rs, a request of pool p, up to whole pages of that
// pool when Config.WholePages asks for it: every block of the pool is
// then a run of whole pages starting on a page boundary (blocks tile a
// segment from its page-aligned base), so sharing one exposes nothing
// else. Sizes that would overflow are left for the size check to refuse.
func (h *Heap) wholePages(rs uint64, p Pool) uint64 {
	if !h.whole {
		return rs
	}
	ps := h.classes[p].PageSize
	if r := roundUp(rs, ps); r >= rs {
		return r
	}
	return rs
}

func (h *Heap) PoolOf(size uint64) Pool {
	// One comparison for the two pools there are: neither constant below
	// compiles unless NumPools is 2 (a loop over poolMax cost the warm
	// path four times the instructions).
	const _, _ = uint(NumPools - 2), uint(2 - NumPools)
	if size <= h.poolMax[0] {
		return Pool(0)
	}
	return Pool(1)
}

func (h *Heap) stateLocked(s vmm.Stream, p Pool, c uint8) *state {
	if s == 0 && h.mu.def[c][p] != nil {
		return h.mu.def[c][p]
	}
	k := stateKey{stream: s, pool: p, class: c}
	st := h.mu.states[k]
	if st == nil {
		st = newState(k, h.mu.nodes)
		h.mu.states[k] = st
		if s == 0 {
			h.mu.def[c][p] = st
		}
		i, _ := slices.BinarySearchFunc(h.mu.shared, st, donorOrder)
		h.mu.shared = slices.Insert(h.mu.shared, i, st)
	}
	return st
}

// numClasses bounds the size classes of Config.SizeClasses: class c > 0
// holds requests of [2^(c-1), 2^c) pages, the last one everything larger.
const numClasses = 32

// numClassesOf is how many size classes pool p has: numClasses under
// Config.SizeClasses, else 1.
func (h *Heap) numClassesOf(p Pool) uint8 {
	if h.classPage[p] == 0 {
		return 1
	}
	return numClasses
}

// classOf is the size class of a request of rs bytes (rounded) in pool p:
// 0 for less than a page or without Config.SizeClasses, else 1 plus the
// log2 of its whole pages, at most numClasses-1.
func (h *Heap) classOf(rs uint64, p Pool) uint8 {
	if h.classPage[p] == 0 {
		return 0
	}
	return uint8(min(bits.Len64(rs/h.classPage[p]), numClasses-1))
}

func (h *Heap) newBlock() *block {
	b := h.mu.spare
	if b == nil {
		return &block{}
	}
	h.mu.spare = b.next
	b.next = nil
	return b
}

func (h *Heap) recycle(b *block) {
	uses := b.uses[:0]
	*b = block{uses: uses, next: h.mu.spare}
	h.mu.spare = b
}

// Alloc returns a block of at least size bytes for use on stream s.
//
// The warm path, a block of the exact size parked in the exact-size lists
// of a shared pool with nothing to settle first, runs here without a
// defer or a call but for the lock's: everything else takes allocCold or
// allocHeld. It is every step of the general path (allocLocked) that
// such a block takes, written out, as a call costs more than most of
// them; TestWarmPathsMatch holds the two to the same results.
func (h *Heap) Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	rs := RoundSize(size)
	pool := h.PoolOf(rs)
	rs = h.wholePages(rs, pool)
	h.mu.Lock()
	// size-1 < limit: size is neither 0 nor above the limit.
	if !h.warmAllocLocked(s) || size-1 >= h.limit || rs < size {
		return h.allocCold(size, rs, pool, s)
	}
	c := h.classOf(rs, pool)
	st := h.mu.def[c][pool]
	if s != 0 || st == nil {
		st = h.stateLocked(s, pool, c)
	}
	// A request of a page or more under Config.PackLongLived is
	// predicted here (pack.go; the keys need every such request): one
	// predicted long-lived goes where packing puts it, past the
	// exact-size lists.
	pred := packPred{slot: -1}
	if rs >= h.packFrom[pool] && !h.wholeRequestLocked(st, rs) {
		if pred = h.predictLocked(st, rs); pred.long {
			return h.allocHeld(size, rs, pool, s, true, PoolID{}, &pred)
		}
	}
	// The head of rs's exact-size list, if the list is in st's recent
	// cache and its head was seen isolated at this shape; else popExact.
	var b *block
	if l := st.recent[slotOf(rs, recentBits)]; l != nil && l.size == rs && l.head != nil && l.head.iso == h.mu.shape {
		b = st.take(l, l.head)
	} else if b = st.popExact(rs, h.mu.shape); b == nil {
		return h.allocHeld(size, rs, pool, s, true, PoolID{}, &pred)
	}
	// handOutLocked for a block of exactly rs bytes: nothing to split.
	b.state = stAllocated
	b.requested = size
	b.born = 0
	// bstats.handOut, its steps inlined.
	if h.mu.bstats.count(pool, rs, size); !h.mu.bstats.takeRoom(pool, int64(rs)) {
		h.mu.bstats.raisePeaks(pool)
	}
	if invariantsOn {
		h.mu.bstats.shadowHandOut(pool, rs, size)
	}
	if h.mu.hist != nil {
		h.noteLocked(ActionAlloc, b.ptr, b.size, b.seg)
	}
	h.mu.handed[handedSlot(b.ptr)] = b
	if pred.slot >= 0 {
		h.noteBornLocked(&pred, b)
	}
	if invariantsOn {
		h.checkWarmAlloc(b, rs, pool)
		h.checkLocked()
	}
	// Read under the lock: once it is given back, a Close may free the
	// block and reuse its struct.
	p := b.ptr
	h.mu.heapLock.Unlock()
	return p, nil
}

// allocCold is Alloc past the warm path's first test, with h.mu held:
// a request of 0 bytes fails without more; the rest is allocHeld's.
func (h *Heap) allocCold(size, rs uint64, pool Pool, s vmm.Stream) (vmm.DevicePtr, error) {
	if size == 0 {
		h.mu.Unlock()
		return 0, errZeroSize()
	}
	return h.allocHeld(size, rs, pool, s, true, PoolID{}, nil)
}

// checkWarmAlloc panics if b, which Alloc's warm path handed out for rs
// bytes of pool, is not what handOutLocked would have left (build tag
// invariants).
func (h *Heap) checkWarmAlloc(b *block, rs uint64, pool Pool) {
	if b.size != rs || b.seg.Pool != pool || !b.seg.st.key.private.IsZero() {
		panic(fmt.Sprintf("xseg: warm path handed out %d bytes at %v of pool %v for %d of pool %v", b.size, b.ptr, b.seg.Pool, rs, pool))
	}
}

func (h *Heap) alloc(size uint64, s vmm.Stream, final bool) (vmm.DevicePtr, error) {
	return h.allocTo(size, s, final, PoolID{})
}

// allocTo allocates from private pool id, or with the zero id from the
// pool an active route picks or else the shared pools.
func (h *Heap) allocTo(size uint64, s vmm.Stream, final bool, id PoolID) (vmm.DevicePtr, error) {
	if size == 0 {
		return 0, errZeroSize()
	}
	rs, pool := h.sizeClass(size)
	h.mu.Lock()
	return h.allocHeld(size, rs, pool, s, final, id, nil)
}

func errZeroSize() error { return fmt.Errorf("allocating 0 bytes: %w", vmm.ErrInvalid) }

// sizeClass returns a request of size bytes rounded and its pool.
func (h *Heap) sizeClass(size uint64) (uint64, Pool) {
	rs := RoundSize(size)
	pool := h.PoolOf(rs)
	return h.wholePages(rs, pool), pool
}

// allocHeld is allocLocked for a caller that holds h.mu: it unlocks it.
func (h *Heap) allocHeld(size, rs uint64, pool Pool, s vmm.Stream, final bool, id PoolID, pred *packPred) (vmm.DevicePtr, error) {
	defer h.mu.Unlock()
	b, err := h.allocLocked(size, rs, pool, s, final, id, pred)
	if err != nil {
		return 0, err
	}
	return b.ptr, nil
}

// warmAllocLocked reports whether an allocation on stream s can take a
// parked block at once: the Heap is open, s is known, and no route,
// deferred free or pending event asks for work first (heapMu.quiet, which
// the last Unlock worked out; the warm path of Alloc looks at it before
// it changes anything).
func (h *Heap) warmAllocLocked(s vmm.Stream) bool {
	if invariantsOn {
		h.checkWarmFlags()
	}
	return h.mu.quiet && (s == 0 || s == h.mu.lastStream)
}

// checkWarmFlags panics if quiet or plain is not what they stand for
// (build tag invariants).
func (h *Heap) checkWarmFlags() {
	if q, p := h.mu.quietNow(), h.mu.plainNow(); q != h.mu.quiet || p != h.mu.plain {
		panic(fmt.Sprintf("xseg: stale warm-path flags: quiet %v, plain %v; now %v, %v", h.mu.quiet, h.mu.plain, q, p))
	}
}

// warmFreeLocked is plainFreeLocked from heapMu.plain, for the warm path
// of Free, which looks at it before it changes anything.
func (h *Heap) warmFreeLocked(b *block) bool {
	if invariantsOn {
		h.checkWarmFlags()
	}
	return h.mu.plain && plainBlock(b)
}

// allocLocked allocates size bytes, rs rounded, of pool on stream s (see
// allocTo for id) and returns the allocated block.
//
// pred is the request's prediction (pack.go) if Alloc's warm path made
// it, else nil: it is made here, once a request either way.
func (h *Heap) allocLocked(size, rs uint64, pool Pool, s vmm.Stream, final bool, id PoolID, pred *packPred) (*block, error) {
	if h.mu.closed {
		return nil, fmt.Errorf("allocating %d bytes: %w", size, vmm.ErrClosed)
	}
	if size > h.limit || rs < size {
		return nil, h.tooLargeLocked(size, s, final)
	}
	if s != 0 && s != h.mu.lastStream {
		if err := h.checkStreamLocked(s); err != nil {
			return nil, fmt.Errorf("allocating %d bytes: %w", size, err)
		}
	}
	var st *state
	if len(h.mu.routes) > 0 || !id.IsZero() {
		var err error
		if st, err = h.privateStateLocked(id, s, rs, pool); err != nil {
			return nil, err
		}
	} else if len(h.mu.deferred) > 0 {
		h.settleLocked()
	}
	if len(h.mu.pending) > 0 && !h.capturingLocked() {
		h.pollLocked()
	}
	if st == nil {
		st = h.stateLocked(s, pool, h.classOf(rs, pool))
	}
	// What this call changed so far (settling, polling) may have freed a
	// neighbour of a parked block: a new shape, so that no earlier look
	// is trusted.
	h.mu.shape++
	// Alloc's warm path, which made pred, has looked in the exact-size
	// lists already, and nothing has changed since (it runs only when
	// nothing is to be settled or polled): a second look finds nothing.
	var b *block
	if pred == nil {
		p := h.packClassLocked(st, rs)
		pred = &p
		if !pred.long {
			b = st.popExact(rs, h.mu.shape)
		}
	}
	if b == nil {
		var err error
		if b, err = h.allocSlowLocked(st, rs, size, final, pred.long); err != nil {
			return nil, err
		}
	}
	b = h.handOutLocked(b, rs, size)
	h.noteBornLocked(pred, b)
	if invariantsOn {
		h.checkLocked()
	}
	return b, nil
}

// handOutLocked makes free block b (in no free structure) an allocated
// block of rs bytes from its start, splitting off the rest, and returns it.
//
// The block always comes from the low end. Taking it from whichever end
// keeps more whole pages in the free rest was tried (2026-11-21): on the
// two shipped traces it moved each peak by exactly one 20 MiB page, down
// on one and up on the other, and a single early decision decided it; the
// plain rule reaches 754 pages on gpt2_train (PyTorch's expandable
// segments: 755) and ties PyTorch on gpt2_varlen.
func (h *Heap) handOutLocked(b *block, rs, req uint64) *block {
	b.state = stAllocated
	b.requested = req
	b.born = 0
	if b.size-rs >= MinBlock {
		r := h.splitAt(b, rs)
		h.coalesce(r)
	}
	h.mu.bstats.handOut(b.seg.Pool, b.size, req)
	if h.mu.hist != nil {
		h.noteLocked(ActionAlloc, b.ptr, b.size, b.seg)
	}
	h.mu.handed[handedSlot(b.ptr)] = b
	return b
}

// Free gives a block back. A block used on other streams (RecordStream)
// is reused only once the work queued on them by now has finished.
//
// The warm path, a block of a shared pool used on its own stream only,
// with no history, pins, route or release threshold to mind, runs without
// a defer; everything else takes freeLocked under a deferred unlock.
func (h *Heap) Free(ptr vmm.DevicePtr) error {
	h.mu.Lock()
	b := h.blockLocked(ptr)
	if h.warmFreeLocked(b) {
		// b stays in its slot of handed: blockLocked looks past a slot
		// whose block is no longer allocated there, and the pair's next
		// Alloc of b puts it there again.
		st := b.seg.st
		h.mu.bstats.free(b.seg.Pool, b.size, b.requested)
		b.requested = 0
		// releaseLocked, written out for the case of a block that goes
		// back to an exact-size list with nobody waiting for a free.
		if st.exactN < maxExact && h.mu.freed == nil {
			b.state = stFree
			h.mu.freeSeq++
			b.freed = h.mu.freeSeq
			if l := b.list; l.hintFor(b) {
				st.link(l, b)
			} else {
				st.pushExact(b)
			}
		} else {
			h.releaseLocked(b)
		}
		if invariantsOn {
			h.checkLocked()
		}
		h.mu.heapLock.Unlock()
		return nil
	}
	return h.freeHeld(ptr, b)
}

// freeHeld is freeLocked for a caller that holds h.mu: it unlocks it.
// A function of its own, so that Free's warm path sets up no defer.
func (h *Heap) freeHeld(ptr vmm.DevicePtr, b *block) error {
	defer h.mu.Unlock()
	return h.freeLocked(ptr, b)
}

// freeLocked is Free past the warm path: b is the block at ptr, or nil.
func (h *Heap) freeLocked(ptr vmm.DevicePtr, b *block) error {
	if h.mu.closed {
		return fmt.Errorf("freeing %v: %w", ptr, vmm.ErrClosed)
	}
	if b == nil || b.state != stAllocated {
		return h.badFreeLocked(ptr, b)
	}
	h.unhandLocked(b)
	if len(b.uses) > 0 {
		if h.capturingLocked() {
			h.deferLocked(b)
		} else if err := h.parkLocked(b); err != nil {
			return err
		}
	}
	if h.mu.hist != nil {
		h.noteLocked(ActionFreeRequested, b.ptr, b.size, b.seg)
	}
	h.unallocateLocked(b)
	pk := b.seg.st.key.private // b may be merged away and recycled below
	if b.state == stAllocated && !h.keepPinnedLocked(b) {
		h.deactivateLocked(b)
	}
	if !h.capturingLocked() {
		if !pk.IsZero() {
			if pp := h.mu.pools[pk]; pp != nil && pp.uses == 0 {
				if err := h.givePoolBackLocked(pp); err != nil {
					h.log.Warn("xseg: giving a released pool's memory back", "pool", pk, "err", err)
				}
			}
		}
		if h.cfg.ReleaseThreshold > 0 {
			h.trimLocked()
		}
	}
	if invariantsOn {
		h.checkLocked()
	}
	return nil
}

// plainFreeLocked reports whether freeing b takes only the warm path:
// an allocated block of a shared pool, used on its own stream only, with
// no history, pins, route or release threshold to mind.
func (h *Heap) plainFreeLocked(b *block) bool { return h.mu.plainNow() && plainBlock(b) }

// plainBlock reports whether b is an allocated block of a shared pool,
// used on its own stream only.
func plainBlock(b *block) bool {
	return b != nil && b.state == stAllocated && len(b.uses) == 0 && b.seg.st.shared
}

// unhandLocked takes freed block b out of Heap.mu.handed, where it sits
// unless another block took its slot since.
func (h *Heap) unhandLocked(b *block) {
	if slot := handedSlot(b.ptr); h.mu.handed[slot] == b {
		h.mu.handed[slot] = nil
	}
}

// handedSlot is the slot of a block at ptr in Heap.mu.handed.
func handedSlot(ptr vmm.DevicePtr) uint64 { return slotOf(uint64(ptr), handedBits) }

// blockLocked returns the block at ptr, or nil: the one handOutLocked last
// put in ptr's slot of handed if it is still allocated at ptr, else the
// ptr map's. An allocated block always sits in the map at its ptr (a block
// leaving the map is recycled, zeroed, or becomes a hole), so a slot can
// be stale but never wrong.
func (h *Heap) blockLocked(ptr vmm.DevicePtr) *block {
	if b := h.mu.handed[handedSlot(ptr)]; b != nil && b.ptr == ptr && b.state == stAllocated {
		return b
	}
	return h.mu.blocks[ptr]
}

// privateStateLocked returns the state of private pool id for an
// allocation of rs bytes on stream s; with the zero id, the state an active
// route picks, or nil.
func (h *Heap) privateStateLocked(id PoolID, s vmm.Stream, rs uint64, p Pool) (*state, error) {
	if id.IsZero() {
		st := h.routeLocked(s, p)
		if st != nil {
			if pp := h.mu.pools[st.key.private]; pp.paused() {
				return nil, pp.pausedError(rs)
			}
		}
		return st, nil
	}
	pp := h.mu.pools[id]
	if pp == nil || pp.uses == 0 {
		return nil, fmt.Errorf("allocating %d bytes in pool %v: the pool is not retained: %w", rs, id, vmm.ErrInvalid)
	}
	if pp.paused() {
		return nil, pp.pausedError(rs)
	}
	return h.poolStateLocked(pp, s, p), nil
}

// unallocateLocked takes freed block b out of the allocated statistics.
func (h *Heap) unallocateLocked(b *block) {
	h.mu.bstats.unallocate(b.seg.Pool, b.size, b.requested)
	b.requested = 0
}

func (h *Heap) badFreeLocked(ptr vmm.DevicePtr, b *block) error {
	if b == nil {
		return fmt.Errorf("freeing %v: not the start of a block of this allocator: %w", ptr, vmm.ErrInvalid)
	}
	return fmt.Errorf("freeing %v: block is not allocated (double free?): %w", ptr, vmm.ErrInvalid)
}

// deactivateLocked makes an allocated or pending block free.
func (h *Heap) deactivateLocked(b *block) {
	if h.mu.hist != nil {
		h.noteLocked(ActionFreeCompleted, b.ptr, b.size, b.seg)
	}
	h.mu.bstats.deactivate(b.seg.Pool, b.size)
	h.releaseLocked(b)
}

// releaseLocked makes block b, no longer counted as active, free.
func (h *Heap) releaseLocked(b *block) {
	b.state = stFree
	h.mu.freeSeq++
	b.freed = h.mu.freeSeq
	st := b.seg.st
	if st.exactN < maxExact {
		st.pushExact(b)
	} else {
		h.coalesce(b)
		h.mu.shape++ // a warm Free may come here
	}
	if h.mu.freed != nil {
		close(h.mu.freed)
		h.mu.freed = nil
	}
}

// RecordStream marks the block at ptr as used on stream s too.
func (h *Heap) RecordStream(ptr vmm.DevicePtr, s vmm.Stream) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return fmt.Errorf("recording stream for %v: %w", ptr, vmm.ErrClosed)
	}
	b := h.mu.blocks[ptr]
	if b == nil || b.state != stAllocated {
		return fmt.Errorf("recording stream %#x for %v: %w", uintptr(s), ptr, spec.ErrNotAllocated)
	}
	if s == b.seg.Stream {
		return nil
	}
	if err := h.checkStreamLocked(s); err != nil {
		return fmt.Errorf("recording a use of %v: %w", ptr, err)
	}
	for _, u := range b.uses {
		if u == s {
			return nil
		}
	}
	b.uses = append(b.uses, s)
	return nil
}

// Stats returns the current statistics.
func (h *Heap) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.statsLocked()
}

// LockCounts returns how many times the Heap's lock was biased to one
// goroutine and how many times another took a bias back (heaplock.go):
// zero and zero under the race detector and where the platform has no
// biased way. Benchmarks report them beside a warm pair's time, to tell
// whether its lock took the biased way (bench/RESULTS.md round 36).
func (h *Heap) LockCounts() (biases, revokes uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.counts()
}

// ResetAccumulatedStats zeroes the statistics that only grow (see
// Stats.ResetAccumulated).
func (h *Heap) ResetAccumulatedStats() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.stats.ResetAccumulated()
	h.mu.bstats.resetAccumulated()
}

// ResetPeakStats makes every peak the current value.
func (h *Heap) ResetPeakStats() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.stats.ResetPeaks()
	h.mu.bstats.resetPeaks()
}
