// The C API of xseg.h with its exact signatures, each a call into the Go
// export of the same name (xsegGo...), which take and return integers only:
// no Go function ever holds a C pointer-typed value such as a stream handle
// of 0x1 or 0x2, which the Go runtime would take for a bad pointer.
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "forked.h"
#include "freequeue.h"
#include "xseg.h"
#include "_cgo_export.h"

struct xseg_fq xseg_fq;

/* A child forked after the library loaded has only the forking thread: the
 * Go runtime's other threads (its start-up, the GC's, its scheduler's) are
 * gone, and a call into Go may wait forever for one of them, or find a
 * lock a vanished thread held. So every entry point refuses in such a
 * child (XSEG_FORK_GUARD), and the error functions say why. */
volatile int xseg_forked;

static void note_fork(void) { xseg_forked = 1; }

__attribute__((constructor)) static void watch_fork(void) { pthread_atfork(NULL, NULL, note_fork); }

const char xseg_fork_error[] =
    "xseg: this process was forked after libxseg was loaded, and the Go runtime inside it does not survive fork(): "
    "xseg refuses every call here (start worker processes with the spawn or forkserver method, or load xseg after "
    "forking)";

static void fq_lock(void) {
	for (int spins = 0; __atomic_exchange_n(&xseg_fq.lock, 1, __ATOMIC_ACQUIRE); spins++) {
		if (spins >= 64) sched_yield();
	}
}

static void fq_unlock(void) { __atomic_store_n(&xseg_fq.lock, 0, __ATOMIC_RELEASE); }

static struct xseg_fq_recent* fq_slot(uint64_t ptr) {
	/* Blocks start at multiples of 512 bytes. */
	uint64_t h = (ptr >> 9) * 0x9E3779B97F4A7C15ull;
	return &xseg_fq.recent[h >> (64 - 12)];
}

_Static_assert(XSEG_FQ_RECENT == 1 << 12, "fq_slot takes 12 bits");

/* fq_note remembers a block handed out; the caller holds the lock. */
static void fq_note(uint64_t ptr, uint64_t size, int device, uint64_t stream, uint32_t epoch) {
	struct xseg_fq_recent* r = fq_slot(ptr);
	r->ptr = ptr;
	r->size = size;
	r->stream = stream;
	r->device = device;
	r->epoch = epoch;
}

int xseg_fq_push(uint64_t ptr, int device) {
	if (__atomic_load_n(&xseg_fq.direct, __ATOMIC_ACQUIRE)) {
		return 0;
	}
	uint32_t epoch = __atomic_load_n(&xseg_fq.epoch, __ATOMIC_ACQUIRE);
	fq_lock();
	/* Again under the lock: an allocation that begins to wait for memory
	 * turns the queue direct, then takes this lock before it drains
	 * (oomWait), so a free either is parked before that drain or sees
	 * direct here; without this check it could park just after the drain
	 * and stay parked through the whole wait. */
	if (__atomic_load_n(&xseg_fq.direct, __ATOMIC_RELAXED)) {
		fq_unlock();
		return 0;
	}
	struct xseg_fq_recent* r = fq_slot(ptr);
	struct xseg_fq_recent known = *r;
	if (known.ptr == ptr) {
		r->ptr = 0; /* the block is being freed: it is no longer handed out */
	}
	uint32_t t = xseg_fq.tail;
	int parked = t - xseg_fq.head < XSEG_FQ_CAP;
	if (parked) {
		struct xseg_fq_entry* e = &xseg_fq.buf[t & (XSEG_FQ_CAP - 1)];
		e->ptr = ptr;
		e->device = device;
		e->kind = XSEG_FQ_FREE;
		if (known.ptr == ptr && known.device == device && known.epoch == epoch && epoch != 0) {
			e->kind = XSEG_FQ_REUSABLE;
			e->size = known.size;
			e->stream = known.stream;
			e->epoch = epoch;
		}
		__atomic_store_n(&xseg_fq.tail, t + 1, __ATOMIC_RELEASE);
	}
	fq_unlock();
	return parked;
}

void xseg_fq_remember(uint64_t ptr, uint64_t size, int device, uint64_t stream, uint32_t epoch) {
	if (ptr == 0 || epoch == 0) {
		return;
	}
	fq_lock();
	fq_note(ptr, size, device, stream, epoch);
	fq_unlock();
}

uint64_t xseg_fq_take_back(uint64_t size, int device, uint64_t stream) {
	if (size == 0 || __atomic_load_n(&xseg_fq.direct, __ATOMIC_ACQUIRE)) {
		return 0;
	}
	uint32_t epoch = __atomic_load_n(&xseg_fq.epoch, __ATOMIC_ACQUIRE);
	if (epoch == 0) {
		return 0;
	}
	fq_lock();
	uint32_t h = xseg_fq.head, t = xseg_fq.tail;
	uint64_t ptr = 0;
	/* The frees parked after a candidate: a block freed again after the
	 * free that made it a candidate (a double free) is not taken back,
	 * or Go would apply that second free to the block's new owner. */
	uint64_t later[XSEG_FQ_SCAN];
	for (int k = 0; k < XSEG_FQ_SCAN && t != h; k++) {
		struct xseg_fq_entry* e = &xseg_fq.buf[--t & (XSEG_FQ_CAP - 1)];
		int again = 0;
		for (int j = 0; j < k; j++) {
			again |= later[j] == e->ptr;
		}
		later[k] = e->ptr;
		if (!again && e->kind == XSEG_FQ_REUSABLE && e->epoch == epoch && e->size == size && e->device == device &&
		    e->stream == stream) {
			e->kind = XSEG_FQ_REUSED;
			ptr = e->ptr;
			fq_note(ptr, size, device, stream, epoch);
			xseg_fq.reused++;
			break;
		}
	}
	fq_unlock();
	return ptr;
}

uint64_t xseg_fq_malloc(ssize_t size, int device, uint64_t stream, char** err, int* oom) {
	uint64_t p = xseg_fq_take_back((uint64_t)size, device, stream);
	if (p != 0) {
		return p;
	}
	uint32_t epoch = 0;
	if (err != NULL) {
		p = xsegGoMallocOrError(size, device, stream, err, oom, &epoch);
	} else {
		p = xsegGoMalloc(size, device, stream, &epoch);
	}
	xseg_fq_remember(p, (uint64_t)size, device, stream, epoch);
	return p;
}

void* xseg_malloc(ssize_t size, int device, void* stream) {
	XSEG_FORK_GUARD(NULL);
	unsigned long long first, second;
	switch (xseg_pool_route(device, stream, &first, &second)) {
	case 0:
		return (void*)(uintptr_t)xseg_fq_malloc(size, device, (uintptr_t)stream, NULL, NULL);
	case 1:
		return (void*)xsegGoMallocInPool(size, device, (uintptr_t)stream, first, second, NULL, NULL);
	default:
		xsegGoSetError("xseg_malloc", "the stream filter of an active CUDA graph pool failed");
		return NULL;
	}
}

void* xseg_malloc_in_pool(ssize_t size, int device, void* stream, unsigned long long first, unsigned long long second) {
	XSEG_FORK_GUARD(NULL);
	return (void*)xsegGoMallocInPool(size, device, (uintptr_t)stream, first, second, NULL, NULL);
}

void* xseg_malloc_at_most(size_t max, size_t min, int device, void* stream, size_t* size) {
	XSEG_FORK_GUARD(NULL);
	return (void*)xsegGoMallocAtMost(max, min, device, (uintptr_t)stream, size);
}

int xseg_free_block(void* ptr, int device) {
	XSEG_FORK_GUARD(-1);
	return xsegGoFreeBlock((uintptr_t)ptr, device);
}

int xseg_pool_retain(int device, unsigned long long first, unsigned long long second) {
	XSEG_FORK_GUARD(-1);
	return xsegGoPoolRetain(device, first, second);
}

int xseg_pool_release(int device, unsigned long long first, unsigned long long second) {
	XSEG_FORK_GUARD(-1);
	return xsegGoReleasePool(device, first, second);
}

char* xseg_pool_json(int device, unsigned long long first, unsigned long long second, int checkpoint) {
	XSEG_FORK_GUARD(NULL);
	return xsegGoPoolJSON(device, first, second, checkpoint);
}

char* xseg_pool_restore(int device, const char* checkpoint, size_t len) {
	XSEG_FORK_GUARD(NULL);
	return xsegGoPoolRestore(device, (char*)checkpoint, len);
}

// xseg_free parks the free in the queue (freequeue.h): no call into Go,
// which applies it at its next call from any thread. A full queue, a
// configuration that wants each free at once (release_threshold_mb) or an
// allocation waiting for memory (freequeue.go's oomWait) frees through Go
// now.
void xseg_free(void* ptr, ssize_t size, int device, void* stream) {
	XSEG_FORK_GUARD();
	if (ptr == NULL || xseg_fq_push((uintptr_t)ptr, device)) {
		return;
	}
	xsegGoFree((uintptr_t)ptr, size, device, (uintptr_t)stream);
}

int xseg_record_stream(void* ptr, void* stream) {
	XSEG_FORK_GUARD(-1);
	return xsegGoRecordStream((uintptr_t)ptr, (uintptr_t)stream);
}

char* xseg_stats_json(int device) {
	XSEG_FORK_GUARD(NULL);
	return xsegGoStatsJSON(device);
}

char* xseg_snapshot_json(int device) {
	XSEG_FORK_GUARD(NULL);
	return xsegGoSnapshotJSON(device);
}

void xseg_string_free(char* s) { free(s); }

int xseg_empty_cache(int device) {
	XSEG_FORK_GUARD(-1);
	return xsegGoEmptyCache(device);
}

int xseg_reset_peak_stats(int device) {
	XSEG_FORK_GUARD(-1);
	return xsegGoResetPeakStats(device);
}

int xseg_reset_accumulated_stats(int device) {
	XSEG_FORK_GUARD(-1);
	return xsegGoResetAccumulatedStats(device);
}

int xseg_configure(const char* conf) {
	XSEG_FORK_GUARD(-1);
	return xsegGoConfigure((char*)conf);
}

int xseg_set_log_level(const char* level) {
	XSEG_FORK_GUARD(-1);
	return xsegGoSetLogLevel((char*)level);
}

ssize_t xseg_share(void* ptr, int device, void* out, size_t cap) {
	XSEG_FORK_GUARD(-1);
	return xsegGoShare((uintptr_t)ptr, device, 0, out, cap);
}

ssize_t xseg_share_for(void* ptr, int device, int importers, void* out, size_t cap) {
	XSEG_FORK_GUARD(-1);
	return xsegGoShare((uintptr_t)ptr, device, importers, out, cap);
}

int xseg_unshare(const void* desc, size_t len) {
	XSEG_FORK_GUARD(-1);
	return xsegGoUnshare((void*)desc, len);
}

static int64_t open_block(const void* desc, size_t len, int device, void** ptr, size_t* size, int wait) {
	// Go checks every argument, NULL out-parameters included, before it
	// opens anything, and writes only to these locals; the caller's are
	// written once there is a handle.
	uintptr_t p = 0;
	size_t n = 0;
	int64_t h = xsegGoOpen((void*)desc, len, device, ptr ? &p : NULL, size ? &n : NULL, wait);
	if (h > 0) {
		*ptr = (void*)p;
		*size = n;
	}
	return h;
}

int64_t xseg_open(const void* desc, size_t len, int device, void** ptr, size_t* size) {
	XSEG_FORK_GUARD(-1);
	return open_block(desc, len, device, ptr, size, 1);
}

int64_t xseg_open_nowait(const void* desc, size_t len, int device, void** ptr, size_t* size) {
	XSEG_FORK_GUARD(-1);
	return open_block(desc, len, device, ptr, size, 0);
}

int xseg_open_wait(int64_t handle) {
	XSEG_FORK_GUARD(-1);
	return xsegGoOpenWait(handle);
}

int xseg_close(int64_t handle) {
	XSEG_FORK_GUARD(-1);
	return xsegGoClose(handle);
}

int xseg_tag(int device, const char* name, unsigned long long* first, unsigned long long* second) {
	XSEG_FORK_GUARD(-1);
	return xsegGoTag(device, (char*)name, first, second);
}

int xseg_pause(int device, const char* tag, int backup) {
	XSEG_FORK_GUARD(-1);
	return xsegGoPause(device, (char*)tag, backup);
}

int xseg_resume(int device, const char* tag) {
	XSEG_FORK_GUARD(-1);
	return xsegGoResume(device, (char*)tag);
}

char* xseg_tag_stats_json(int device, const char* tag) {
	XSEG_FORK_GUARD(NULL);
	return xsegGoTagStatsJSON(device, (char*)tag);
}

char* xseg_tags_json(int device) {
	XSEG_FORK_GUARD(NULL);
	return xsegGoTagsJSON(device);
}

void xseg_set_memory_fraction(double fraction, int device) {
	XSEG_FORK_GUARD();
	xsegGoSetMemoryFraction(fraction, device);
}

int xseg_memory_fraction(int device, double* out) {
	XSEG_FORK_GUARD(-1);
	return xsegGoMemoryFraction(device, out);
}

int xseg_set_memory_limit(int device, unsigned long long bytes) {
	XSEG_FORK_GUARD(-1);
	return xsegGoSetMemoryLimit(device, bytes);
}

int xseg_cache_info(int device, size_t* largest) {
	XSEG_FORK_GUARD(-1);
	return xsegGoCacheInfo(device, largest);
}

int xseg_record_history(int device, size_t max_entries) {
	XSEG_FORK_GUARD(-1);
	return xsegGoRecordHistory(device, max_entries);
}

char* xseg_history_json(int device) {
	XSEG_FORK_GUARD(NULL);
	return xsegGoHistoryJSON(device);
}

const char* xseg_version(void) { return XSEG_VERSION; }

const char* xseg_last_error(void) {
	if (xseg_forked) {
		return xseg_fork_error;
	}
	return xsegGoLastError();
}
