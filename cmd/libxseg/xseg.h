/*
 * xseg.h: the C API of libxseg.so, xseg's GPU memory allocator as a
 * PyTorch pluggable allocator (torch.cuda.memory.CUDAPluggableAllocator).
 *
 * Every function is safe to call from any thread. Allocation functions use
 * the CUDA context current on the calling thread (PyTorch's). The library
 * starts at the first xseg_malloc: it reads XSEG_CONF (or the string given
 * to xseg_configure), XSEG_BACKEND ("cuda", the default, or "host") and
 * XSEG_HOST_CAPACITY (bytes, a multiple of 2 MiB), and opens the driver;
 * one allocator per device is made at that device's first allocation. A bad
 * value of any of these, or of XSEG_LOG (read when the library is loaded),
 * makes that first use fail, and every later one with the same reason. A
 * function that fails returns NULL or -1 and keeps the reason for
 * xseg_last_error.
 *
 * The Go runtime inside the library does not survive fork(): in a child
 * forked after the library was loaded every function fails at once (void
 * ones do nothing, the throwing ones throw) and xseg_last_error says why.
 * Start worker processes with the spawn or forkserver method, or fork
 * before loading the library.
 */
#ifndef XSEG_H
#define XSEG_H

#include <stdint.h>
#include <sys/types.h>

#define XSEG_VERSION "0.1.0"

#ifdef __cplusplus
#include <functional>
#include <utility>

/* The C++ types of PyTorch's private-pool hooks (CUDAPluggableAllocator's
 * set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and
 * set_release_pool): a pool id is c10's MempoolId_t, the filter says which
 * allocations go to the pool. */
typedef struct CUstream_st *cudaStream_t;
typedef std::pair<unsigned long long, unsigned long long> xseg_pool_id;
typedef std::function<bool(cudaStream_t)> xseg_stream_filter;

extern "C" {
/* The hooks, to be given to PyTorch as function pointers
 * (python/xseg's install() does). begin retains pool id on device (making it
 * if need be) and routes to it, until end, every allocation of device the
 * filter accepts; release drops one use of the pool, and the last gives its
 * memory back. Blocks of a pool go to nothing outside it. Each throws
 * std::runtime_error with the reason on failure. C++ callers only. */
void xseg_begin_allocate_to_pool(int device, xseg_pool_id id, xseg_stream_filter filter);
void xseg_end_allocate_to_pool(int device, xseg_pool_id id);
void xseg_release_pool(int device, xseg_pool_id id);

/* More of PyTorch's hooks (set_reset_fn, set_record_stream_fn,
 * set_memory_fraction_fn), each throwing std::runtime_error with the reason
 * on failure. xseg_empty_cache_hook is xseg_empty_cache(-1) (what
 * torch.cuda.empty_cache reaches), except that a device with a CUDA graph
 * capture underway keeps its cache, and so do the kept imports then,
 * where xseg_empty_cache fails: PyTorch's own allocator does not fail
 * there, and nothing may wait or unmap while a capture records;
 * xseg_record_stream_hook is
 * xseg_record_stream, quiet for memory that is not xseg's;
 * xseg_memory_fraction_hook is xseg_set_memory_fraction. C++ callers only. */
void xseg_empty_cache_hook(void);
void xseg_record_stream_hook(void* ptr, cudaStream_t stream);
void xseg_memory_fraction_hook(double fraction, int device);

/* PyTorch's cacheInfo, which its CUDAPluggableAllocator refuses and gives
 * no hook for (cuDNN's autotuner, torch.backends.cudnn.benchmark, calls it
 * before it tries convolution algorithms): xseg_torch_route_cache_info
 * points the cacheInfo entry of that class's virtual table at
 * xseg_torch_cache_info, which answers with xseg_cache_info and throws
 * std::runtime_error with the reason on failure. It finds the table and
 * the method by name in the PyTorch libraries the process has loaded and
 * changes nothing unless it finds the method exactly once in the table.
 * 0 on success (or when already routed), -1 with the reason for
 * xseg_last_error. python/xseg's install() calls it. C++ callers only. */
void xseg_torch_cache_info(void* self, signed char device, size_t* largest);
int xseg_torch_route_cache_info(void);
}
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* xseg_malloc returns size bytes on device for use on stream (a
 * cudaStream_t / CUstream; NULL is the default stream), NULL for size 0 or
 * on failure (out of memory, no driver, negative size). */
void* xseg_malloc(ssize_t size, int device, void* stream);

#ifdef __cplusplus
/* xseg_malloc_or_throw is xseg_malloc for C++ callers: where xseg_malloc
 * returns NULL for a size other than 0 it throws instead. Out of memory is
 * thrown as an exception PyTorch takes for its own c10::OutOfMemoryError
 * (torch.OutOfMemoryError in Python, message starting "CUDA out of
 * memory."), anything else as std::runtime_error with the reason. python/xseg
 * installs it, because PyTorch turns these exceptions into Python ones but
 * does not check a NULL from a pluggable allocator. Never call it from C. */
void* xseg_malloc_or_throw(ssize_t size, int device, void* stream);
#endif

/* xseg_malloc_at_most returns the largest block it can get of at most max
 * and at least min bytes on device for stream, shrinking the request by the
 * configured oom_size_factor (OOM_SIZE_FACTOR) after each out-of-memory;
 * only the attempt at min runs the whole OOM policy. *size (if not NULL)
 * receives the block's size. NULL on failure, also unless 0 < min <= max
 * and min <= 2^62. A max above 2^62 is taken as 2^62: for as much as
 * possible, pass SIZE_MAX (the first attempt is at most the device's free
 * memory and the bytes xseg holds unused, within any memory limit). It
 * does not route to an active private pool. */
void* xseg_malloc_at_most(size_t max, size_t min, int device, void* stream, size_t* size);

/* xseg_free gives back a block of device. size and stream are ignored: the
 * block's own stream and every stream recorded with xseg_record_stream
 * order its reuse. Freeing NULL does nothing; freeing a pointer xseg did not
 * return records an error and changes nothing. The free takes effect at
 * the next call of any function here from any thread (each applies the
 * frees made before it, before its own work), or at once when 256 frees
 * are waiting, release_threshold_mb is set, or an allocation is waiting
 * for memory (oom_wait_ms, oom_max_retries: the frees made before it began
 * to wait are applied then, so a free on another thread reaches it while
 * it waits, as xseg_free_block's would); so a bad free's error is
 * there for xseg_last_error right after, as before. Until then, an
 * xseg_malloc (or xseg_malloc_or_throw) of exactly the size a block
 * smaller than a page was allocated for, on the same device and stream,
 * may take the block back
 * without calling into the allocator, if no other function here was called
 * since the block was allocated and nothing records history, routes to a
 * pool or uses the block elsewhere (freequeue.go says exactly when): it is
 * what freeing and allocating again would give, and the statistics count
 * both. */
void xseg_free(void* ptr, ssize_t size, int device, void* stream);

/* xseg_record_stream marks the block that starts at ptr as used on stream
 * too: once freed, it is reused only after the work queued on stream by then
 * has finished. Returns 0 when recorded, 1 when ptr is not a block of xseg
 * (nothing done), -1 on failure (a block of xseg and a stream that is not
 * live, say). */
int xseg_record_stream(void* ptr, void* stream);

/* xseg_free_block is xseg_free that reports: 0, or -1 (with the reason in
 * xseg_last_error) for a pointer that is not a live block of device. */
int xseg_free_block(void* ptr, int device);

/* xseg_stats_json and xseg_snapshot_json return device's statistics
 * (PyTorch's names) and snapshot as JSON, in a string the caller frees with
 * xseg_string_free; NULL on failure. A device without allocations reports
 * zeros. */
char* xseg_stats_json(int device);
char* xseg_snapshot_json(int device);
void xseg_string_free(char* s);

/* xseg_empty_cache drops the kept mappings of other processes' blocks (see
 * xseg_open) and gives every whole free page of device (-1: all devices)
 * back to the driver; xseg_reset_peak_stats makes every peak the current
 * value. Both return 0, or -1 on failure. */
int xseg_empty_cache(int device);
int xseg_reset_peak_stats(int device);

/* xseg_reset_accumulated_stats zeroes the counts that only grow (blocks
 * and bytes allocated and freed so far, retries, OOMs) of device (-1: all
 * devices), as torch.cuda.reset_accumulated_memory_stats; 0 or -1. */
int xseg_reset_accumulated_stats(int device);

/* xseg_configure sets the configuration (XSEG_CONF syntax, at most 64 KiB)
 * applied over XSEG_CONF at first use. Only before the first xseg_malloc; a
 * later call replaces an earlier one. Returns 0, or -1 (too late, or does
 * not parse). */
int xseg_configure(const char* conf);

/* xseg_set_log_level sets the level of the log written to standard error:
 * "off" (the default, or XSEG_LOG), "error", "warn", "info", "debug".
 * Returns 0, or -1 for an unknown level or NULL (the level stays as it
 * was). An unknown XSEG_LOG leaves the log off and fails the library's
 * first use (see the top of this file). */
int xseg_set_log_level(const char* level);

/* Cross-process sharing (package ipc). xseg_share shares the live block
 * that starts at ptr on device with other processes: its pages stay out of
 * reuse until xseg_unshare and until every importer has closed (or died),
 * even after xseg_free. The allocator must have been made shareable
 * (shareable:true in XSEG_CONF or xseg_configure). It writes the
 * descriptor (at most a few KiB; 64 KiB always suffices) to out and
 * returns its length, or -1 (also when cap is too small: nothing is then
 * shared). xseg_unshare stops serving new importers of desc; 0 or -1. */
ssize_t xseg_share(void* ptr, int device, void* out, size_t cap);

/* xseg_share_for is xseg_share for a known number of importers (1 to
 * 2^20): the share ends by itself once that many have opened it, each
 * keeping the pages until it closes, as torch.multiprocessing needs (one
 * share per tensor sent). importers 0 is xseg_share. A share for one
 * importer is claimed: the importer that fetches it by pidfd seals a claim
 * memfd with its pid and a nonce, and reads without waiting for this
 * process, which serves that importer alone and keeps the pages for it
 * until its request is served or it exits (also past xseg_unshare). */
ssize_t xseg_share_for(void* ptr, int device, int importers, void* out, size_t cap);
int xseg_unshare(const void* desc, size_t len);

/* xseg_open maps the block a descriptor names (from xseg_share of any
 * process) for device: *ptr and *size receive its address and length.
 * Opening one descriptor twice shares one mapping. Returns a handle (> 0)
 * for xseg_close, or -1, with *ptr and *size unchanged; a NULL desc, ptr
 * or size, or len 0, fails before anything is opened. xseg_close unmaps once the last handle of the
 * mapping closes; 0 or -1. The mapping stays valid after the exporter
 * exits. After its last close a mapping stays mapped (lease ended) for
 * XSEG_IMPORT_KEEP_MS milliseconds (read at the first open; default 1000,
 * 0: none), at most eight of them, and a later share of the same exporter
 * allocations opens on it without mapping again; xseg_empty_cache drops
 * them, so memory their exporter released returns to the device. The
 * close that ends the lease waits, up to XSEG_LEASE_ACK_MS milliseconds
 * (read at the first open; default 20, 0: no wait), for the exporter to
 * drop it, so that the exporter's next allocation can reuse the block. */
int64_t xseg_open(const void* desc, size_t len, int device, void** ptr, size_t* size);
int xseg_close(int64_t handle);

/* xseg_open_nowait is xseg_open that returns before the exporter has
 * answered the lease request, so that the caller can build what it needs
 * over *ptr meanwhile; it must call xseg_open_wait(handle), and see it
 * return 0, before it reads or writes a byte there. -1 from xseg_open_wait
 * (the exporter refused: the share ended first) leaves the pages
 * unprotected: read nothing, xseg_close the handle. xseg_open_wait of a
 * handle from xseg_open, or a second time, or of an open that claimed a
 * share for one importer (see xseg_share_for), returns at once. */
int64_t xseg_open_nowait(const void* desc, size_t len, int device, void** ptr, size_t* size);
int xseg_open_wait(int64_t handle);

/* Private pools from C. xseg_pool_route reports whether an allocation on
 * stream of device belongs to an active pool (1, with its id in *first and
 * *second), not (0), or a filter failed or first or second is NULL (-1,
 * the reason in xseg_thread_error); xseg_malloc routes with it.
 * xseg_malloc_in_pool allocates from pool (first, second), which must be
 * retained, NULL on failure. xseg_pool_json returns the addresses of the
 * blocks allocated in a pool (checkpoint 0: a JSON array) or a checkpoint
 * of the pool (checkpoint 1: a JSON object), to free with
 * xseg_string_free; xseg_pool_restore puts a pool back to such a
 * checkpoint (len bytes) and returns {"freed": [...], "allocated": [...]}
 * as JSON. Both NULL on failure. */
int xseg_pool_route(int device, void* stream, unsigned long long* first, unsigned long long* second);
void* xseg_malloc_in_pool(ssize_t size, int device, void* stream, unsigned long long first, unsigned long long second);
char* xseg_pool_json(int device, unsigned long long first, unsigned long long second, int checkpoint);
char* xseg_pool_restore(int device, const char* checkpoint, size_t len);

/* xseg_pool_retain makes pool (first, second) on device if need be and
 * holds one more use of it (torch.cuda.MemPool); xseg_pool_release drops
 * one, the last giving the pool's memory back. 0 or -1. */
int xseg_pool_retain(int device, unsigned long long first, unsigned long long second);
int xseg_pool_release(int device, unsigned long long first, unsigned long long second);

/* --- memory limit and history --- */

/* The memory limit: PyTorch's per-process memory fraction. The bytes xseg
 * reserves on a device (mapped pages and its page cache: reserved_bytes)
 * may not grow past it; an allocation that would need that fails as out of
 * memory, naming the limit, once emptying the cache did not help (no
 * retries with delays). A limit below what is reserved stops only growth.
 * xseg_set_memory_fraction is PyTorch's memory_fraction_fn
 * (CUDAPluggableAllocator): fraction of the device's total memory, in
 * [0, 1] (0 allows no growth at all, 1 the whole device); it makes the
 * device's allocator if need be. Being void it reports a bad fraction or
 * device only in xseg_last_error, and then changes nothing: check with
 * xseg_memory_fraction, which writes the limit as a fraction to *out (the
 * fraction set, if set as one; 0 when there is no limit) and returns 0, or
 * -1 (bad device, out NULL). xseg_set_memory_limit sets the limit in bytes
 * (0: none); 0 or -1. The limit in bytes is "memory_limit_bytes" in
 * xseg_stats_json, and "memory_limit_set" there tells a limit of 0 bytes
 * (a fraction of 0) from none. */
void xseg_set_memory_fraction(double fraction, int device);
/* xseg_cache_info writes to *largest an estimate of the largest block one
 * allocation on device could get now (what PyTorch's cacheInfo reports):
 * the driver's free memory plus the bytes xseg holds that no block uses or
 * waits on, and under a memory limit no more than the limit less the bytes
 * in use. Optimistic, as PyTorch's own: an allocation of that size may
 * still fail. 0, or -1 (bad device, largest NULL, no driver). */
int xseg_cache_info(int device, size_t* largest);
int xseg_memory_fraction(int device, double* out);
int xseg_set_memory_limit(int device, unsigned long long bytes);

/* The allocation history, for PyTorch's memory_viz
 * (torch.cuda.memory._record_memory_history): xseg_record_history keeps
 * the last max_entries events of device (at most 1 << 24; 0 stops and
 * drops them), making the device's allocator if need be; 0 or -1.
 * xseg_history_json returns them, oldest first, as a JSON array of
 * {"action", "addr", "size", "stream", "time_us", "device_free"} objects
 * (and "segment_pool_id" for a private pool's), to free with
 * xseg_string_free; NULL on failure. Actions, with PyTorch's names:
 * "alloc", "free_requested", "free_completed" (the block became reusable:
 * its other streams' work done), "segment_map" and "segment_unmap" (pages
 * mapped into or unmapped from a segment), "segment_alloc" and
 * "segment_free" (the fallback allocator's whole segments), "oom" (addr 0,
 * size the request, device_free the device's free memory). */
int xseg_record_history(int device, size_t max_entries);
char* xseg_history_json(int device);

/* --- tags: pause and resume at stable addresses --- */

/* A tag is a named private pool of device's allocator whose physical
 * memory can be given back while every address in it stays reserved
 * (paused), and mapped again at the same addresses later (resumed): what
 * vLLM's CuMemAllocator (sleep / wake_up) and torch_memory_saver (pause /
 * resume) do, so that pointers held anywhere, CUDA graphs captured
 * earlier included, stay valid. A name is 1 to 256 bytes of UTF-8
 * without NUL (a longer string is read no further than byte 257).
 *
 * xseg_tag makes tag name on device if need be (and the device's
 * allocator) and writes its pool id to *first and *second (neither may be
 * NULL): xseg_malloc_in_pool with that id allocates in the tag. 0 or -1.
 *
 * xseg_begin_region makes tag name on device if need be and sends every
 * later allocation of the calling thread on device (xseg_malloc and
 * xseg_malloc_or_throw, any stream: PyTorch's tensors once xseg is its
 * allocator) to it, until xseg_end_region on the same thread. Regions
 * nest: the innermost open one of a thread wins, and xseg_end_region ends
 * it (-1 when the thread has none open on device). An active PyTorch pool
 * (a CUDA graph capture, torch.cuda.use_mem_pool) whose filter accepts an
 * allocation wins over a region. A region belongs to its thread: end it
 * there, before the thread exits (a thread made later may get the same
 * thread id). 0 or -1.
 *
 * xseg_pause pauses tag (NULL: every tag) of device (-1: every device
 * with an allocator; a named tag then on every device that has it): it
 * waits for all work on the device, copies the bytes of the tag's
 * allocated blocks to host memory if backup is not 0, then gives the
 * tag's whole free pages back to the driver for good (and the page
 * cache with them) and unmaps and releases the rest of its pages; resume
 * maps only those again. Blocks stay allocated at their addresses,
 * and nothing may touch them until resumed (on CUDA a kernel that reads
 * paused memory faults). Allocating in a paused tag fails ("the tag is
 * paused"); freeing a block of it works. It refuses a tag with a block
 * shared with another process (xseg_share: the importer maps the same
 * pages), and any pause while a CUDA graph capture is underway. Pausing a
 * paused tag does nothing. xseg_resume maps new pages at the same
 * addresses for tag (NULL: every paused tag) of device (-1: all), for the
 * device and its peers, and copies the backup back; without one the bytes
 * are unspecified (zero on the host backend). Resuming a live tag does
 * nothing; a failed resume leaves the tag paused, backup kept, and can be
 * retried. Each tag is paused or resumed wholly or not at all; the first
 * that fails stops the call. Both 0 or -1.
 *
 * xseg_tag_stats_json returns tag's statistics on device as a JSON object
 * {"name", "id": [first, second], "paused", "backup", "reserved_bytes",
 * "paused_bytes", "allocated_bytes", "allocations", "backup_bytes",
 * "pauses", "remaps"}; xseg_tags_json those of every tag of device, by
 * name, as a JSON array. "remaps" counts the resumes: the addresses
 * stay, the physical pages do not, so memory registered with something
 * that holds pages (NCCL buffer registration, RDMA) is registered again
 * when it moves. Free with xseg_string_free; NULL on failure. */
int xseg_tag(int device, const char* name, unsigned long long* first, unsigned long long* second);
int xseg_begin_region(int device, const char* name);
int xseg_end_region(int device);
int xseg_pause(int device, const char* tag, int backup);
int xseg_resume(int device, const char* tag);
char* xseg_tag_stats_json(int device, const char* tag);
char* xseg_tags_json(int device);

/* xseg_version returns XSEG_VERSION. */
const char* xseg_version(void);

/* xseg_last_error returns the text of the most recent failure of any thread,
 * "" if none: at most 4 KiB, a longer text cut and ending in "...". The
 * string stays valid at least until 64 more failures have happened; copy it
 * at once. */
const char* xseg_last_error(void);

/* xseg_thread_error returns the text of the most recent failure of a call
 * the calling thread made, "" if none: what xseg_last_error said right
 * after it, whatever other threads have failed since. Unlike
 * xseg_last_error it applies no parked frees, so reading it right after a
 * failed call gives that call's own reason; a bad xseg_free shows here
 * once a call of this thread has applied it (any thread's: see xseg_free),
 * and a later failing call of the thread replaces it. The string belongs
 * to the thread and stays valid until its next failure; at most 4 KiB. */
const char* xseg_thread_error(void);

#ifdef __cplusplus
}
#endif

#endif /* XSEG_H */
