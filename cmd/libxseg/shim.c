// The C API of xseg.h with its exact signatures, each a call into the Go
// export of the same name (xsegGo...), which take and return integers only:
// no Go function ever holds a C pointer-typed value such as a stream handle
// of 0x1 or 0x2, which the Go runtime would take for a bad pointer.
#include <stdlib.h>

#include "xseg.h"
#include "_cgo_export.h"

void* xseg_malloc(ssize_t size, int device, void* stream) {
	unsigned long long first, second;
	switch (xseg_pool_route(device, stream, &first, &second)) {
	case 0:
		return (void*)xsegGoMalloc(size, device, (uintptr_t)stream);
	case 1:
		return (void*)xsegGoMallocInPool(size, device, (uintptr_t)stream, first, second, NULL, NULL);
	default:
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

void xseg_free(void* ptr, ssize_t size, int device, void* stream) {
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
