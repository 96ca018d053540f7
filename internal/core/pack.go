package core

import (
	"math"

	"github.com/xseg-dev/xseg/vmm"
)

// Packing of blocks predicted long-lived (Config.PackLongLived).
//
// A block that outlives the temporaries around it strands the free rest
// of the pages it partly fills once the pages around it are recycled:
// best fit puts a KV-cache tensor where a temporary of its size was just
// freed, at the start of that temporary's pages, and when the
// temporaries around it go, the rest of its last page stays mapped and
// free, too small for anything else, until the tensor is freed. Placed
// side by side, long-lived blocks share those pages instead. So a
// request predicted long-lived goes to the free block at the lowest
// address that fits it, among the pages already mapped: packing by
// address, as first fit does, without mapping a page for it (a hole
// grown into for a long-lived block at every step of a decode loop
// would move pages at every step; bench/RESULTS.md round 40). The one
// exception is chainHoleLocked's: a place on a page boundary gives way
// to a lower hole that continues a live block's pages.
//
// The prediction stands in for the call site, which an allocator does
// not see: the request's size and the sizes of the last packContext
// requests of a page or more in its range (its stream and pool). A
// program that repeats a sequence of allocations (a model's layers, a
// loop's steps) repeats these keys. A request is predicted long-lived
// when the last block allocated under its key is still allocated: the
// key's blocks outlive one turn of the sequence (layer i's K and V find
// layer i-1's alive; a temporary finds its predecessor freed). Keys live
// in a direct-mapped table of packSlots entries; two keys in one slot
// forget the older one, which costs a prediction, never correctness:
// either placement holds any block.

// packContext is how many earlier requests of a page or more a key
// holds.
const packContext = 3

// packSlots is the size of the table of keys (a power of two).
const packSlots = 1 << 12

// packEntry is the last block allocated under a key, with the serial it
// was handed out with: the block is that allocation while it is
// allocated with that serial (block structs are reused). A key names a
// point of a range's sequence of large requests (its state, the
// request's size and the sizes before it); the entry holds the key's
// 64-bit hash, which names it: two keys of one hash (as rare as any two
// random 64-bit numbers that agree) would share a prediction, which
// costs placement, never correctness. 24 bytes, so that the table stays
// small enough for the CPU's caches on the allocation path.
type packEntry struct {
	key  uint64
	b    *block
	born uint64
}

// packer is the prediction's state, under the Heap's lock.
type packer struct {
	table  *[packSlots]packEntry // made on first use
	serial uint64
	// predicted and long count the requests predicted and those
	// predicted long-lived (PackCounts).
	predicted, long uint64
}

// PackCounts returns how many requests Config.PackLongLived predicted
// (each request of a page or more of a shared pool, once) and how many
// of them it predicted long-lived.
func (h *Heap) PackCounts() (predicted, long uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.pack.predicted, h.mu.pack.long
}

// packPred is a request's prediction: long-lived or not, and the table
// slot and key (its hash) to record the block handed out for it under
// (noteBornLocked); slot -1 for none.
type packPred struct {
	long bool
	slot int
	key  uint64
}

// noPred is the prediction of a request that is not predicted.
func noPred() packPred { return packPred{slot: -1} }

// packClassLocked predicts a request of rs bytes in st under
// Config.PackLongLived. Requests under a page are neither predicted nor
// part of any key. It moves st's context on: one call a request.
func (h *Heap) packClassLocked(st *state, rs uint64) packPred {
	if ps := h.packFrom[st.key.pool]; ps == math.MaxUint64 || rs < ps || !st.key.private.IsZero() {
		return noPred()
	}
	return h.predictLocked(st, rs)
}

// predictLocked is packClassLocked for a request it predicts: of a page
// or more (h.packFrom) in st, a state of a shared pool.
//
// A whole number of pages fills every page it touches: nothing to share,
// so best fit and the exact-size lists serve it as well, and it is never
// predicted long-lived. It moves st's context on like any other, but
// its key is neither looked up nor recorded: only a request of the same
// size could ask for it.
func (h *Heap) predictLocked(st *state, rs uint64) packPred {
	if h.wholeRequestLocked(st, rs) {
		return noPred()
	}
	p := &h.mu.pack
	p.predicted++
	if p.table == nil {
		p.table = new([packSlots]packEntry)
	}
	key := packHash(st, rs)
	st.pushContext(rs)
	slot := int(key & (packSlots - 1))
	e := &p.table[slot]
	long := e.key == key && e.b != nil && e.b.state == stAllocated && e.b.born == e.born
	if long {
		p.long++
	}
	return packPred{long: long, slot: slot, key: key}
}

// wholeRequestLocked predicts a request of rs bytes in st if it is a
// whole number of pages, and reports whether it was: such a request is
// counted and moves st's context on, nothing more (predictLocked). Small
// enough to be inlined into Alloc's warm path, which so calls
// predictLocked only for the rest.
func (h *Heap) wholeRequestLocked(st *state, rs uint64) bool {
	if !h.wholePagesOf(rs, st.key.pool) {
		return false
	}
	h.mu.pack.predicted++
	st.pushContext(rs)
	return true
}

// pushContext moves st's context on by a request of rs bytes.
func (st *state) pushContext(rs uint64) {
	st.lastLarge[2], st.lastLarge[1], st.lastLarge[0] = st.lastLarge[1], st.lastLarge[0], rs
}

// wholePagesOf reports whether rs bytes are a whole number of packing's
// pages of pool p (h.packFrom): by a mask where the page is a power of
// two, as the default's is, sparing a division on the allocation path.
func (h *Heap) wholePagesOf(rs uint64, p Pool) bool {
	ps := h.packFrom[p]
	if ps&(ps-1) == 0 {
		return rs&(ps-1) == 0
	}
	return rs%ps == 0
}

// noteBornLocked records b, just handed out for the request predicted
// by pred, as the last block of pred's key.
func (h *Heap) noteBornLocked(pred *packPred, b *block) {
	if pred.slot < 0 {
		return
	}
	p := &h.mu.pack
	p.serial++
	b.born = p.serial
	p.table[pred.slot&(packSlots-1)] = packEntry{key: pred.key, b: b, born: b.born}
}

// packHash is the key of a request of rs bytes in st: st (its stream,
// pool and class; the states of shared pools are never dropped while the
// Heap lives), rs and st's context. Each input is multiplied by a
// constant of its own (odd, so no input's bits are lost), so that the
// order of the sizes counts; the products are independent, so that the
// CPU works them out at once, on the allocation path; SplitMix64's
// finalizer mixes their sum.
func packHash(st *state, rs uint64) uint64 {
	// It names packContext's three sizes one by one: neither constant
	// below compiles unless packContext is 3.
	const _, _ = uint(packContext - 3), uint(3 - packContext)
	x := rs*0x9e3779b97f4a7c15 +
		st.lastLarge[0]*0xc2b2ae3d27d4eb4f +
		st.lastLarge[1]*0x165667b19e3779f9 +
		st.lastLarge[2]*0xd6e8feb86659fd93 +
		st.packKey
	return packMix(x)
}

// packKeyTerm is packHash's term for the state of key k (state.packKey).
func packKeyTerm(k stateKey) uint64 {
	return (uint64(k.stream) ^ uint64(k.pool)<<56 ^ uint64(k.class)<<48) * 0xff51afd7ed558ccd
}

// packMix is SplitMix64's finalizer: every input bit moves every output
// bit, so that sizes that differ only in their high bits (multiples of a
// page) spread over the table.
func packMix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// chainHoleLocked is where a block predicted long-lived continues the
// pages of a live block instead of starting new ones. b, the free block
// packing found (firstFitLocked), starts on a page boundary, so a block
// placed there would leave the free rest of the page before it mapped
// and caught between live blocks for as long as both live. If a hole
// lower down follows a free block that starts inside a page, right after
// an allocated block, and fits rs bytes with it, the block goes there
// instead, grown into the hole. It returns that hole, or nil.
//
// Only where the Heap recycles pages (Config.RecyclePages) and b's pages
// can be recycled in turn (all but at most two of those the block would
// have covered are whole pages of b's own, not inside a chunk that goes
// on past it): the growth takes free pages from the top of the range
// down (unmapPassLocked), so pages move rather than add to the range.
// generate_large's worst variant went from 1.0096 to 1.0058 with 12 %
// fewer maps (bench/RESULTS.md round 43).
//
// A hole where mapping would wait for the stream (retiredBusyLocked:
// pages retired from there after the last mark the GPU has passed) is
// passed over: a chain is a preference, and GPT-2's training loop lost
// the CPU's lead over the GPU once a step to it (bench/trace's
// TestRecordedLoopWaitFree). Where the GPU keeps up, nothing changes.
func (h *Heap) chainHoleLocked(b *block, rs uint64) *block {
	if b == nil || h.holder == nil {
		return nil
	}
	seg, ps := b.seg, b.seg.PageSize
	if uint64(b.ptr-seg.Base)%ps != 0 {
		return nil
	}
	if lo, hi := wholePages(seg, b); hi <= lo || uint64(hi-lo)+2*ps < min(b.size, rs) {
		return nil
	}
	for _, hole := range seg.holes { // in address order
		if hole.ptr > b.ptr {
			break
		}
		p := hole.prev
		if !p.isFreeIn() || uint64(p.ptr-seg.Base)%ps == 0 || p.prev == nil || p.prev.state != stAllocated {
			continue
		}
		if h.cfg.SettleChains && hole.cycles >= chainCycles {
			// The pages there went back and forth between chain
			// growths and recycling chainCycles times: a loop moves
			// them every turn. Place the block as if no hole were there.
			continue
		}
		if p.size >= rs {
			// p fits alone: packing passed over it, as rs bytes there
			// would end inside a chunk of p's; growing would not help.
			continue
		}
		if !fitsHole(hole, rs) {
			continue
		}
		if _, size := h.growSpan(hole, rs); h.retiredBusyLocked(seg, hole.ptr, hole.ptr.Add(size)) {
			// Pages retired from there may still be touched by work
			// queued before their free: mapping there would wait for
			// the stream. A chain is a preference, not worth a stall.
			continue
		}
		return hole
	}
	return nil
}

// firstFitLocked takes the free block of st at the lowest address that
// fits rs bytes, out of the free structures, or nil: mapped pages only,
// as the exact-size lists are flushed into the tree first and a hole is
// never grown into here. A free block the request would end inside a
// chunk of (one physical allocation going on past it) is passed over:
// best fit would split the chunk, unmapping it and mapping its pages one
// by one, a cost packing is not worth (GPT-2's first step made 1,150
// maps more with it, bench/RESULTS.md round 41).
func (h *Heap) firstFitLocked(st *state, rs uint64) *block {
	h.flush(st)
	return st.lowestFit(rs, func(b *block) bool {
		if h.bounds == nil || h.pagesStayPut() {
			return true
		}
		_, _, split := h.chunkToSplit(b, rs)
		return !split
	})
}

// chainCycles bounds, under Config.SettleChains, how often a chain
// growth maps pages where recycling took a chain growth's pages away
// before. A loop whose step needs those pages in two places, as a
// chained block after its live neighbour and as part of a large block
// elsewhere (GPT-2's logits), otherwise moves them there and back in
// every step, forever: 30 pages a step of GPT-2 small's training
// (bench/RESULTS.md round 46). After chainCycles such rounds on one page
// the chain passes over the holes that hold it, and that part of the
// layout stays. With three rounds the worst variant of every trace of
// bench/traces stays within 0.0001 of where it is without the rule (one
// round raised amp_checkpoint's from 1.0158 to 1.0182); a count per
// page, never reset while the segment lives.
const chainCycles = 3

// noteMapped records that the pages of [lo, lo+size) are mapped, by a
// chain growth if chained.
func (s *Seg) noteMapped(lo vmm.DevicePtr, size uint64, chained bool) {
	if !chained && len(s.chained) == 0 {
		return
	}
	first := int(uint64(lo-s.Base) / s.PageSize)
	for i := first; i < first+int(size/s.PageSize); i++ {
		if chained {
			if s.chained == nil {
				s.chained = make(map[int]struct{})
			}
			s.chained[i] = struct{}{}
		} else {
			delete(s.chained, i)
		}
	}
}

// noteUnmapped records that the n bytes of pages at lo went, taken by a
// growth if recycled, and returns the most cycles of any of them: a page
// a chain growth mapped and recycling took completes a cycle.
func (s *Seg) noteUnmapped(lo vmm.DevicePtr, n uint64, recycled bool) uint8 {
	if len(s.chained) == 0 && len(s.cycles) == 0 {
		return 0
	}
	var most uint8
	first := int(uint64(lo-s.Base) / s.PageSize)
	for i := first; i < first+int(n/s.PageSize); i++ {
		if _, ok := s.chained[i]; ok {
			delete(s.chained, i)
			if recycled {
				if s.cycles == nil {
					s.cycles = make(map[int]uint8)
				}
				s.cycles[i] = min(s.cycles[i], 254) + 1
			}
		}
		most = max(most, s.cycles[i])
	}
	return most
}
