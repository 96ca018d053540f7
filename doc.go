// Package xseg is a GPU memory allocator built on the CUDA driver's
// virtual-memory management API: the "expandable segments" of PyTorch's
// caching allocator as a library.
//
// [Open] picks a backend (CUDA when a driver and a device are there, else
// the host backend, which runs the same contract on Linux host memory) and
// an allocator (package expandable: one reserved address range per stream
// and pool, physical pages mapped into it on demand, best-fit blocks,
// stream-ordered reuse, whole free pages given back on EmptyCache, on OOM
// and above a release threshold). On a device without virtual memory
// management it picks package fallback instead: the same block core over
// plain allocations. [ChooseAllocator] says which and why; Options force
// either ([Backend], [AllocatorKind]). Every allocator implements
// [Allocator] and is safe for concurrent use. Open returns a
// [DeviceAllocator], one type whatever it picked, with every capability:
// sharing blocks with other processes (an ipc.BlockSource), peer access,
// private pools for CUDA graphs, a memory limit, an allocation history,
// and tags whose physical memory can be paused and resumed at the same
// addresses ([Tagger]); what the allocator underneath cannot do fails with
// vmm.ErrNotSupported.
// [OpenDevices] holds one allocator per device of a driver and grants peer
// access between them.
//
//	a, err := xseg.Open(xseg.Options{})
//	if err != nil { ... }
//	defer a.Close()
//	p, err := a.Alloc(64<<20, 0)
//	...
//	err = a.Free(p)
//
// Configuration ([Config], defined with [Stats] and [Snapshot] in package
// spec) comes from [Options.Config] or, when it is nil, from the
// environment: XSEG_CONF ("large_page_mb:20,release_threshold_mb:512,
// oom_max_retries:3,oom_delay_ms:200,oom_wait_ms:1000", see [ParseConfig])
// over the seed allocator's OOM_MAX_RETRIES, OOM_DELAY_MS, OOM_SIZE_FACTOR
// and OOM_VERBOSE.
//
// Errors match the sentinels of package vmm through errors.Is: a request
// that cannot be met is vmm.ErrOutOfMemory, bad input vmm.ErrInvalid, use
// after Close vmm.ErrClosed.
package xseg
