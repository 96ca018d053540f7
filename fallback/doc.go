// Package fallback is xseg's allocator for drivers and devices without
// virtual memory management (older drivers, some virtualised GPUs, some
// platforms): the same Allocator API, block core and OOM policy as package
// expandable, over fixed segments of plain allocations: cuMemAlloc on
// CUDA, anonymous memory (mmap) on the host backend. It is what PyTorch's
// native caching allocator does, and what xseg.Open picks when a device
// reports no VMM.
//
// # Overview
//
// The allocator serves one device. Requests are rounded up to 512 bytes
// and sorted into two pools: small (up to Config.SmallLimit, 1 MiB by
// default) and large. A segment is one plain allocation whose size is
// fixed when it is made (see SegmentSize): 2 MiB (Config.SmallPageSize)
// for the small pool, 20 MiB (Config.LargePageSize) for large requests
// below 10 MiB, and the request rounded up to 2 MiB for larger ones. The
// block core (package internal/core) tiles each segment with blocks in
// address order; a segment is its own single page, mapped from the start.
//
// The configuration is read as New says: the expandable allocator's page
// policy (recycle_pages, size_classes, pack_long_lived, settle_chains, chunk_mb,
// chunk_min_mb) does not
// apply and is ignored; the page size keys set the segment sizes, and
// xseg.DefaultConfig's page layout (2 MiB large pages, no small pool),
// which cannot be told from keys set to the same values, becomes the
// layout above.
//
// An allocation looks, in order, at the exact-size list of its (stream,
// pool), then the best-fit tree of coalesced free blocks of all the
// stream's segments of the pool (splitting the block found, the rest
// staying free), then a new segment. A freed block merges with the free
// blocks beside it in its segment; blocks never merge across segments,
// whose addresses are unrelated.
//
// # Streams
//
// Segments, and the blocks in them, belong to the stream they were made
// for. RecordStream and pending frees work as in package expandable: a
// block used on other streams is reused only after events recorded on
// them at Free have completed.
//
// # Giving memory back
//
// A segment is given back (MemFree) only when it is wholly free: on
// EmptyCache, on OOM, and, when Config.ReleaseThreshold is set, by Free
// once the free reserved bytes pass the threshold: the block core's
// release then gives back every wholly free segment (core.ReleasePolicy
// WholeSegments), and runs again only once more has become free than it
// left behind; not while a CUDA graph capture is underway. Freed segments are not cached: Config.PageCacheBytes
// is unused. ReservedBytes counts the segments held; PagesCreated counts
// the segments allocated and Unmaps those freed.
//
// # Out of memory
//
// When MemAlloc runs out of memory the allocator waits for the pending
// frees of the stream, gives back every wholly free segment of every
// stream and retries, then follows the configured waits and retries; the
// final error matches vmm.ErrOutOfMemory and says the size, the device's
// free memory, this allocator's reserved and allocated bytes and the
// retries made (see package expandable for the whole policy).
//
// # Sharing
//
// A block is shared with other processes through package ipc
// (Exporter.ShareBlock), which the Allocator serves as an ipc.BlockSource
// (PinBlock): what travels is the block's whole segment, one plain
// allocation, with the block's offset and length in it. On CUDA the
// segment goes as its legacy IPC handle (cuIpcGetMemHandle; the importer
// opens it with cuIpcOpenMemHandle, once per process); on the host
// backend the segment moves into a memfd at its first share (see
// vmm/host's ExportAllocFD) and goes as that fd, which the importer maps
// like any exported page. A shared block that is freed is not reused, and
// its segment not given back, until the share is closed and every
// importer has let go. Every block is shareable: Config.Shareable has no
// effect here.
//
// # Concurrency
//
// An Allocator is safe for concurrent use by multiple goroutines. One
// mutex guards the core; the driver is called with it held.
package fallback
