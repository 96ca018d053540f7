// The C API of xseg.h with its exact signatures, each a call into the Go
// export of the same name (xsegGo...), which take and return integers only:
// no Go function ever holds a C pointer-typed value such as a stream handle
// of 0x1 or 0x2, which the Go runtime would take for a bad pointer.
#include <sched.h>
#include <stdlib.h>

#include "freequeue.h"
#include "xseg.h"
#include "_cgo_export.h"

struct xseg_fq xseg_fq;

static void fq_lock(void) {
	for (int spins = 0; __atomic_exchange_n(&xseg_fq.lock, 1, __ATOMIC_ACQUIRE); spins++) {
		if (spins >= 64) sched_yield();
	}
}

static void fq_unlock(void) { __atomic_store_n(&xseg_fq.lock, 0, __ATOMIC_RELEASE); }

int xseg_fq_push(uint64_t ptr, int device) {
	if (__atomic_load_n(&xseg_fq.direct, __ATOMIC_ACQUIRE)) {
		return 0;
	}
	fq_lock();
	uint32_t t = xseg_fq.tail;
	int parked = t - xseg_fq.head < XSEG_FQ_CAP;
	if (parked) {
		xseg_fq.buf[t & (XSEG_FQ_CAP - 1)].ptr = ptr;
		xseg_fq.buf[t & (XSEG_FQ_CAP - 1)].device = device;
		__atomic_store_n(&xseg_fq.tail, t + 1, __ATOMIC_RELEASE);
	}
	fq_unlock();
	return parked;
}

void* xseg_malloc(ssize_t size, int device, void* stream) {
	unsigned long long first, second;
	switch (xseg_pool_route(device, stream, &first, &second)) {
	case 0:
		return (void*)xsegGoMalloc(size, device, (uintptr_t)stream);
	case 1:
		return (void*)xsegGoMallocInPool(size, device, (uintptr_t)stream, first, second, NULL, NULL);
	default:
		xsegGoSetError("xseg_malloc", "the stream filter of an active CUDA graph pool failed");
		return NULL;
	}
}

void* xseg_malloc_in_pool(ssize_t size, int device, void* stream, unsigned long long first, unsigned long long second) {
	return (void*)xsegGoMallocInPool(size, device, (uintptr_t)stream, first, second, NULL, NULL);
}

void* xseg_malloc_at_most(size_t max, size_t min, int device, void* stream, size_t* size) {
	return (void*)xsegGoMallocAtMost(max, min, device, (uintptr_t)stream, size);
}

int xseg_free_block(void* ptr, int device) { return xsegGoFreeBlock((uintptr_t)ptr, device); }

int xseg_pool_retain(int device, unsigned long long first, unsigned long long second) {
	return xsegGoPoolRetain(device, first, second);
}

int xseg_pool_release(int device, unsigned long long first, unsigned long long second) {
	return xsegGoReleasePool(device, first, second);
}

char* xseg_pool_json(int device, unsigned long long first, unsigned long long second, int checkpoint) {
	return xsegGoPoolJSON(device, first, second, checkpoint);
}

char* xseg_pool_restore(int device, const char* checkpoint, size_t len) {
	return xsegGoPoolRestore(device, (char*)checkpoint, len);
}

// xseg_free parks the free in the queue (freequeue.h): no call into Go,
// which applies it at its next call from any thread. A full queue, or a
// configuration that wants each free at once, frees through Go now.
void xseg_free(void* ptr, ssize_t size, int device, void* stream) {
	if (ptr == NULL || xseg_fq_push((uintptr_t)ptr, device)) {
		return;
	}
	xsegGoFree((uintptr_t)ptr, size, device, (uintptr_t)stream);
}

int xseg_record_stream(void* ptr, void* stream) {
	return xsegGoRecordStream((uintptr_t)ptr, (uintptr_t)stream);
}

char* xseg_stats_json(int device) { return xsegGoStatsJSON(device); }

char* xseg_snapshot_json(int device) { return xsegGoSnapshotJSON(device); }

void xseg_string_free(char* s) { free(s); }

int xseg_empty_cache(int device) { return xsegGoEmptyCache(device); }

int xseg_reset_peak_stats(int device) { return xsegGoResetPeakStats(device); }

int xseg_reset_accumulated_stats(int device) { return xsegGoResetAccumulatedStats(device); }

int xseg_configure(const char* conf) { return xsegGoConfigure((char*)conf); }

int xseg_set_log_level(const char* level) { return xsegGoSetLogLevel((char*)level); }

ssize_t xseg_share(void* ptr, int device, void* out, size_t cap) {
	return xsegGoShare((uintptr_t)ptr, device, 0, out, cap);
}

ssize_t xseg_share_for(void* ptr, int device, int importers, void* out, size_t cap) {
	return xsegGoShare((uintptr_t)ptr, device, importers, out, cap);
}

int xseg_unshare(const void* desc, size_t len) { return xsegGoUnshare((void*)desc, len); }

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
	return open_block(desc, len, device, ptr, size, 1);
}

int64_t xseg_open_nowait(const void* desc, size_t len, int device, void** ptr, size_t* size) {
	return open_block(desc, len, device, ptr, size, 0);
}

int xseg_open_wait(int64_t handle) { return xsegGoOpenWait(handle); }

int xseg_close(int64_t handle) { return xsegGoClose(handle); }

int xseg_tag(int device, const char* name, unsigned long long* first, unsigned long long* second) {
	return xsegGoTag(device, (char*)name, first, second);
}

int xseg_pause(int device, const char* tag, int backup) { return xsegGoPause(device, (char*)tag, backup); }

int xseg_resume(int device, const char* tag) { return xsegGoResume(device, (char*)tag); }

char* xseg_tag_stats_json(int device, const char* tag) { return xsegGoTagStatsJSON(device, (char*)tag); }

char* xseg_tags_json(int device) { return xsegGoTagsJSON(device); }

const char* xseg_version(void) { return XSEG_VERSION; }

const char* xseg_last_error(void) { return xsegGoLastError(); }
