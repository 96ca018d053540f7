// Package expandable is xseg's expandable-segments allocator: segments that
// grow and shrink by physical pages under a fixed address, best-fit blocks,
// stream-ordered reuse and the OOM policy.
//
// # Overview
//
// The allocator serves one device. Requests are rounded up to 512 bytes
// and sorted into two pools: small (up to Config.SmallLimit; 0 by default,
// so that every request is large; 1 MiB under ClassicConfig) and large.
// The default stream's pools each get one segment: an
// address range as large as the device's memory, reserved at first use
// and never moved. Any other (stream, pool) reserves what it needs: at
// least 1 GiB or 8 times the request, and a new segment twice the size of
// its largest when one is full (internal/core decides), so a thousand
// streams do not exhaust the address space. Physical pages (2 MiB in both
// pools by default, 20 MiB in the large pool under ClassicConfig; one
// driver handle each, or one for a chunk of several under
// Config.ChunkBytes) are mapped into the segment on demand, so a segment
// is a run of mapped pages with unmapped holes, and the block core
// (package internal/core) tiles it with blocks in address order:
// allocated, pending, free, or unmapped holes.
//
// An allocation looks, in order, at
//
//  1. the exact-size list of its (stream, pool): a block freed with exactly
//     this size and no free neighbour, handed out without any search (the
//     warm path: a lock, two map operations, no allocation);
//  2. the best-fit tree of coalesced free blocks, by (size, address); a
//     free block followed by unmapped pages counts as the size it could
//     grow to, so the block at the end of the mapped pages is kept for
//     growth while a bounded block fits;
//  3. new pages: at the lowest hole of the segment that, with the free
//     block before it, fits; the block starts at that free block and only
//     the missing pages are mapped, one Map per page and ONE SetAccess for
//     the run. Pages come from the page cache first. Before new ones are
//     created, whole free pages elsewhere in the segment are unmapped into
//     the cache and reused: a free page in the middle of a segment is
//     worth nothing while the segment grows at its end.
//
// A freed block goes to its exact-size list; lists are coalesced into the
// tree when a request misses them, before pages are mapped, and before
// anything is unmapped, so lazy coalescing never costs memory.
//
// # Streams
//
// A block belongs to the stream it was allocated on and is reused by that
// stream only. RecordStream adds other streams that use it; freeing such a
// block records one (pooled) event on each and parks the block as pending.
// Pending events are polled at the next allocation; a block whose events
// have all completed becomes free. Before pages are unmapped the
// segment's stream is synchronized and its pending events waited for.
//
// # Giving memory back
//
// Whole free pages are unmapped on EmptyCache (which also gives back empty
// reservations, the page cache and idle events), on OOM, and when the free
// bytes in mapped pages pass Config.ReleaseThreshold (off by default).
// Unmapped pages go to a bounded cache (Config.PageCacheBytes) and are
// reused before new ones are created. ReservedBytes counts the physical
// pages the allocator holds: mapped ones and cached ones.
//
// # Pause and resume
//
// A tag (TagSet.Tag) is a private pool with a name. Pause gives its
// physical pages back to the device (after waiting for the device and,
// if asked, copying its allocated blocks to host memory) while its
// reserved ranges, segments and blocks stay: every address stays valid.
// Pages are unmapped one by one and released at once, not cached. Resume
// maps new pages at exactly the runs that were mapped, with the usual one
// SetAccess a run for the device and every enabled peer, and copies the
// backup back. A tag is live or paused, never in between: a page that
// fails to unmap stays mapped as a stuck page (reserved, not the tag's)
// until the next map over it or EmptyCache, and a Resume that fails is
// undone. Blocks pinned for sharing refuse a pause. The rules are in
// internal/core/pause.go; xseg.Tagger is the user's view.
//
// # Out of memory
//
// When the driver runs out of memory the allocator waits for the pending
// frees of the stream, unmaps every whole free page of every segment (all
// streams), releases the page cache and retries; then, if configured, it
// waits up to Config.OOMWait for frees by other goroutines and retries
// Config.OOMMaxRetries times with exponential backoff from Config.OOMDelay
// (for memory held by other processes). The final error matches
// vmm.ErrOutOfMemory and says the size asked for, the device's free
// memory, this allocator's reserved and allocated bytes and the retries
// made. AllocAtMost shrinks its request by Config.OOMSizeFactor down to a
// minimum; Alloc never returns less than asked.
//
// # Concurrency
//
// An Allocator is safe for concurrent use by multiple goroutines. One
// mutex guards it; it is released only while the OOM policy sleeps or
// waits. The driver is called with the mutex held.
package expandable
