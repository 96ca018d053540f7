// tags loads libxseg.so with dlopen and checks tags, regions, pause and
// resume from C on the host backend (where a block's address is host
// memory this program can read and write): bytes kept by a pause with
// backup, addresses unchanged, the memory given back, allocation in a
// paused tag refused with a clear error, regions routing only their
// thread, nesting, many cycles, and bad arguments. Usage: tags LIB
// [share]. Prints "ok" or what failed.
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xseg.h"
#include "harness.h"

SYM(xseg_malloc)
SYM(xseg_malloc_in_pool)
SYM(xseg_free)
SYM(xseg_free_block)
SYM(xseg_pool_json)
SYM(xseg_configure)
SYM(xseg_share)
SYM(xseg_unshare)
SYM(xseg_tag)
SYM(xseg_begin_region)
SYM(xseg_end_region)
SYM(xseg_pause)
SYM(xseg_resume)
SYM(xseg_tag_stats_json)
SYM(xseg_tags_json)
SYM(xseg_pool_route)

static void load(const char* path) {
	void* h = open_common(path);
	LOAD(h, xseg_malloc) LOAD(h, xseg_malloc_in_pool) LOAD(h, xseg_free) LOAD(h, xseg_free_block)
	LOAD(h, xseg_pool_json) LOAD(h, xseg_configure)
	LOAD(h, xseg_share) LOAD(h, xseg_unshare) LOAD(h, xseg_tag) LOAD(h, xseg_begin_region)
	LOAD(h, xseg_end_region) LOAD(h, xseg_pause) LOAD(h, xseg_resume) LOAD(h, xseg_tag_stats_json)
	LOAD(h, xseg_tags_json) LOAD(h, xseg_pool_route)
}


// num reads the number after "key": in js; -1 if absent.
static long long num(const char* js, const char* key) {
	char k[96];
	snprintf(k, sizeof k, "\"%s\":", key);
	const char* at = js ? strstr(js, k) : NULL;
	return at ? atoll(at + strlen(k)) : -1;
}

// tag_num reads one field of tag's statistics; -1 on failure.
static long long tag_num(const char* tag, const char* key) {
	char* js = p_xseg_tag_stats_json(0, tag);
	long long v = num(js, key);
	if (js) p_xseg_string_free(js);
	return v;
}

// tag_is reports whether tag's statistics say "key":true.
static int tag_is(const char* tag, const char* key) {
	char* js = p_xseg_tag_stats_json(0, tag);
	char k[96];
	snprintf(k, sizeof k, "\"%s\":true", key);
	int v = js && strstr(js, k) != NULL;
	if (js) p_xseg_string_free(js);
	return v;
}

// reserved is the device's reserved bytes now.
static long long reserved(void) {
	char* js = p_xseg_stats_json(0);
	const char* k = "\"reserved_bytes\":{\"all\":{\"current\":";
	const char* at = js ? strstr(js, k) : NULL;
	long long v = at ? atoll(at + strlen(k)) : -1;
	if (js) p_xseg_string_free(js);
	return v;
}

// in_pool reports whether ptr is among the blocks of pool (first, second).
static int in_pool(unsigned long long first, unsigned long long second, const void* ptr) {
	char* js = p_xseg_pool_json(0, first, second, 0);
	char want[32];
	snprintf(want, sizeof want, "%llu", (unsigned long long)(uintptr_t)ptr);
	int v = 0;
	for (const char* at = js; at && (at = strstr(at, want)) != NULL; at += strlen(want)) {
		char before = at == js ? '[' : at[-1], after = at[strlen(want)];
		if ((before == '[' || before == ',') && (after == ']' || after == ',')) v = 1;
	}
	if (js) p_xseg_string_free(js);
	return v;
}

static void fill(unsigned char* p, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + seed);
}

static int same(const unsigned char* p, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i++)
		if (p[i] != (unsigned char)(i * 131 + seed)) return 0;
	return 1;
}

static void bad_args(void) {
	unsigned long long f = 7, s = 7;
	char longname[300];
	memset(longname, 'x', sizeof longname - 1);
	longname[sizeof longname - 1] = 0;
	CHECK(p_xseg_tag(0, NULL, &f, &s) == -1 && error_has("xseg_tag: tag name is NULL"), "NULL name");
	CHECK(p_xseg_tag(0, "", &f, &s) == -1 && error_has("want 1 to 256 bytes"), "empty name");
	CHECK(p_xseg_tag(0, longname, &f, &s) == -1 && error_has("longer than 256 bytes"), "a 299-byte name");
	CHECK(p_xseg_tag(0, "\xff\xfe", &f, &s) == -1 && error_has("UTF-8"), "a name that is not UTF-8");
	CHECK(p_xseg_tag(0, "w", NULL, &s) == -1 && error_has("NULL"), "NULL first");
	CHECK(p_xseg_tag(0, "w", &f, NULL) == -1 && error_has("NULL"), "NULL second");
	CHECK(p_xseg_tag(70, "w", &f, &s) == -1 && error_has("device 70"), "a device out of range");
	CHECK(f == 7 && s == 7, "a failed xseg_tag wrote its id");
	CHECK(p_xseg_begin_region(0, NULL) == -1 && error_has("NULL"), "region with a NULL name");
	CHECK(p_xseg_pool_route(0, NULL, NULL, NULL) == -1 && error_has("NULL"), "pool_route with NULL out-parameters");
	CHECK(p_xseg_begin_region(-1, "w") == -1 && error_has("device -1"), "region on device -1");
	CHECK(p_xseg_end_region(0) == -1 && error_has("no region is open on this thread"), "end without a region");
	CHECK(p_xseg_end_region(99) == -1 && error_has("device 99 out of range"), "end on a bad device");
	CHECK(p_xseg_pause(-5, NULL, 0) == -1 && error_has("out of range"), "pause of device -5");
	CHECK(p_xseg_resume(64, NULL) == -1 && error_has("out of range"), "resume of device 64");
	CHECK(p_xseg_pause(0, longname, 0) == -1 && error_has("longer than 256"), "pause of a long name");
	CHECK(p_xseg_tag_stats_json(0, NULL) == NULL && error_has("NULL"), "stats of a NULL tag");
	CHECK(p_xseg_tags_json(-3) == NULL && error_has("out of range"), "tags of device -3");
	// Before the first allocation nothing is paused, and no tag exists.
	CHECK(p_xseg_pause(0, NULL, 1) == 0 && p_xseg_resume(-1, NULL) == 0, "pause/resume of no tags");
	CHECK(p_xseg_pause(0, "nope", 1) == -1 && error_has("no such tag"), "pause of no tag");
	char* js = p_xseg_tags_json(0);
	CHECK(js && strcmp(js, "[]") == 0, "tags of a device without an allocator: %s", js ? js : "NULL");
	if (js) p_xseg_string_free(js);
}

static void* other_thread(void* arg) {
	// The main thread's open region does not reach this thread.
	void* p = p_xseg_malloc(4096, 0, NULL);
	const unsigned long long* id = arg;
	long routed = p && in_pool(id[0], id[1], p);
	p_xseg_free(p, 4096, 0, NULL);
	return (void*)(p == NULL ? 2 : routed);
}

static void pause_resume(void) {
	unsigned long long wf, ws, kf, ks, f2, s2;
	CHECK(p_xseg_tag(0, "weights", &wf, &ws) == 0, "tag weights");
	CHECK(wf == ULLONG_MAX && ws >= 1, "a tag's pool id is (2^64-1, n): (%llu, %llu)", wf, ws);
	CHECK(p_xseg_tag(0, "weights", &f2, &s2) == 0 && f2 == wf && s2 == ws, "the same tag twice, the same id");

	// Weights: two blocks through a region; one outside it.
	const size_t wn = 3 << 20, sn = 1000, kn = 2 << 20;
	CHECK(p_xseg_begin_region(0, "weights") == 0, "begin region weights");
	unsigned char* w = p_xseg_malloc((ssize_t)wn, 0, NULL);
	unsigned char* small = p_xseg_malloc((ssize_t)sn, 0, NULL);
	unsigned long long ids[2] = {wf, ws};
	pthread_t t;
	void* routed = (void*)3;
	pthread_create(&t, NULL, other_thread, ids);
	pthread_join(t, &routed);
	CHECK(routed == NULL, "another thread's allocation went to the region's tag (%ld)", (long)routed);
	// Nesting: the innermost region wins, ending it goes back to the outer.
	// NULL out-parameters are refused, not written through, while a
	// region routes (they were: a crash) and while nothing does.
	unsigned long long rf = 0, rs = 0;
	CHECK(p_xseg_pool_route(0, NULL, &rf, &rs) == 1 && rf == wf && rs == ws, "the open region routes");
	CHECK(p_xseg_pool_route(0, NULL, NULL, NULL) == -1 && error_has("NULL"), "pool_route with NULL out-parameters in a region");
	CHECK(p_xseg_pool_route(0, NULL, &rf, NULL) == -1 && error_has("NULL"), "pool_route with a NULL second in a region");
	CHECK(p_xseg_begin_region(0, "kv") == 0, "begin region kv inside weights");
	unsigned char* kv = p_xseg_malloc((ssize_t)kn, 0, NULL);
	CHECK(p_xseg_end_region(0) == 0, "end kv");
	unsigned char* w2 = p_xseg_malloc(64, 0, NULL);
	CHECK(p_xseg_end_region(0) == 0, "end weights");
	unsigned char* out = p_xseg_malloc((ssize_t)sn, 0, NULL);
	CHECK(w && small && kv && w2 && out, "allocations");
	if (!w || !small || !kv || !w2 || !out) return;
	CHECK(p_xseg_tag(0, "kv", &kf, &ks) == 0 && ks != ws, "tag kv");
	CHECK(in_pool(wf, ws, w) && in_pool(wf, ws, small) && in_pool(wf, ws, w2), "the region's blocks are the tag's");
	CHECK(in_pool(kf, ks, kv) && !in_pool(wf, ws, kv), "the inner region's block is kv's");
	CHECK(!in_pool(wf, ws, out) && !in_pool(kf, ks, out), "a block after the region is no tag's");
	fill(w, wn, 1);
	fill(small, sn, 2);
	fill(kv, kn, 3);
	CHECK(tag_num("weights", "allocations") == 3, "weights has 3 blocks");
	CHECK(tag_num("weights", "allocated_bytes") >= (long long)(wn + sn + 64), "allocated bytes");
	long long wres = tag_num("weights", "reserved_bytes"), kres = tag_num("kv", "reserved_bytes");
	CHECK(wres >= (long long)wn && kres >= (long long)kn, "reserved bytes %lld %lld", wres, kres);
	char* js = p_xseg_tags_json(0);
	CHECK(js && strstr(js, "\"name\":\"kv\"") && strstr(js, "\"name\":\"weights\"") &&
	          strstr(js, "\"name\":\"kv\"") < strstr(js, "\"name\":\"weights\""),
	      "tags by name: %s", js ? js : "NULL");
	if (js) p_xseg_string_free(js);

	// Pause weights with a backup: its pages go back, its blocks stay.
	long long before = reserved();
	CHECK(p_xseg_pause(0, "weights", 1) == 0, "pause weights");
	CHECK(tag_is("weights", "paused") && tag_is("weights", "backup"), "weights paused with backup");
	CHECK(tag_num("weights", "reserved_bytes") == 0, "a paused tag reserves nothing");
	CHECK(tag_num("weights", "paused_bytes") == wres, "paused bytes %lld, want %lld", tag_num("weights", "paused_bytes"), wres);
	CHECK(tag_num("weights", "backup_bytes") == (long long)(wn + sn + 64), "backup bytes %lld", tag_num("weights", "backup_bytes"));
	CHECK(tag_num("weights", "allocations") == 3, "blocks stay allocated while paused");
	CHECK(reserved() == before - wres, "device reserved %lld, want %lld", reserved(), before - wres);
	CHECK(!tag_is("kv", "paused"), "kv is live");

	// Allocating in a paused tag fails, by id and through a region.
	CHECK(p_xseg_malloc_in_pool(4096, 0, NULL, wf, ws) == NULL && error_has("tag \"weights\"") &&
	          error_has("the tag is paused (resume it first)"),
	      "allocation by id in a paused tag");
	CHECK(p_xseg_begin_region(0, "weights") == 0, "a region of a paused tag opens");
	CHECK(p_xseg_malloc(4096, 0, NULL) == NULL && error_has("the tag is paused"), "allocation in a paused region");
	CHECK(p_xseg_end_region(0) == 0, "end");
	// Freeing a block of a paused tag works; the block is not restored.
	CHECK(p_xseg_free_block(w2, 0) == 0, "free in a paused tag");
	CHECK(tag_num("weights", "allocations") == 2, "freed while paused");

	// Pause everything else without backup; weights stays as it is.
	CHECK(p_xseg_pause(0, NULL, 0) == 0, "pause all");
	CHECK(tag_is("kv", "paused") && !tag_is("kv", "backup"), "kv paused without backup");
	CHECK(tag_is("weights", "backup") && tag_num("weights", "pauses") == 1, "a paused tag is left alone");
	CHECK(p_xseg_pause(-1, "weights", 0) == 0 && tag_num("weights", "pauses") == 1, "pausing again does nothing");
	CHECK(p_xseg_pause(-1, "nope", 0) == -1 && error_has("no such tag on any device"), "pause of no tag, all devices");
	CHECK(p_xseg_resume(0, "nope") == -1 && error_has("no such tag"), "resume of no tag");
	CHECK(p_xseg_tag_stats_json(0, "nope") == NULL && error_has("no such tag"), "stats of no tag");

	// Resume weights: the same addresses, the bytes back.
	CHECK(p_xseg_resume(-1, "weights") == 0, "resume weights");
	CHECK(!tag_is("weights", "paused") && tag_num("weights", "remaps") == 1, "resumed once");
	CHECK(tag_num("weights", "reserved_bytes") == wres && tag_num("weights", "backup_bytes") == 0, "mapped again");
	CHECK(in_pool(wf, ws, w) && in_pool(wf, ws, small), "the blocks keep their addresses");
	CHECK(same(w, wn, 1) && same(small, sn, 2), "the backup came back");
	CHECK(p_xseg_resume(0, NULL) == 0 && !tag_is("kv", "paused"), "resume all");
	CHECK(kv[0] == 0 && kv[kn - 1] == 0, "without backup the host backend gives zeros");
	CHECK(p_xseg_resume(0, NULL) == 0 && tag_num("kv", "remaps") == 1, "resuming a live tag does nothing");
	CHECK(reserved() == before, "reserved back to %lld: %lld", before, reserved());
	unsigned char* again = p_xseg_malloc_in_pool(4096, 0, NULL, wf, ws);
	CHECK(again != NULL, "allocation in a resumed tag");
	p_xseg_free(again, 4096, 0, NULL);

	// Many cycles: the bytes stay, nothing grows.
	fill(kv, kn, 4);
	for (int i = 0; i < 200; i++) {
		if (p_xseg_pause(0, NULL, 1) != 0 || p_xseg_resume(0, NULL) != 0) {
			CHECK(0, "cycle %d", i);
			break;
		}
	}
	CHECK(same(w, wn, 1) && same(small, sn, 2) && same(kv, kn, 4), "bytes kept over 200 cycles");
	CHECK(reserved() == before, "reserved after 200 cycles %lld, want %lld", reserved(), before);
	CHECK(tag_num("weights", "pauses") == 201 && tag_num("kv", "remaps") == 201, "counted");

	p_xseg_free(w, (ssize_t)wn, 0, NULL);
	p_xseg_free(small, (ssize_t)sn, 0, NULL);
	p_xseg_free(kv, (ssize_t)kn, 0, NULL);
	p_xseg_free(out, (ssize_t)sn, 0, NULL);
	CHECK(tag_num("weights", "allocations") == 0 && tag_num("kv", "allocations") == 0, "all freed");
}

// shared: a tag with a block shared with another process refuses a pause.
static void shared(void) {
	CHECK(p_xseg_configure("shareable:true") == 0, "shareable configuration refused");
	CHECK(p_xseg_begin_region(0, "s") == 0, "region");
	void* p = p_xseg_malloc(1 << 20, 0, NULL);
	CHECK(p_xseg_end_region(0) == 0 && p != NULL, "allocation");
	static char desc[65536];
	ssize_t len = p_xseg_share(p, 0, desc, sizeof desc);
	CHECK(len > 0, "share");
	CHECK(p_xseg_pause(0, "s", 1) == -1 && error_has("shared with another process"), "pause of a shared block");
	CHECK(!tag_is("s", "paused"), "the refused tag is live");
	CHECK(len <= 0 || p_xseg_unshare(desc, (size_t)len) == 0, "unshare");
	p_xseg_free(p, 1 << 20, 0, NULL);
}

int main(int argc, char** argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: tags LIB [share]\n");
		return 2;
	}
	load(argv[1]);
	if (argc > 2 && strcmp(argv[2], "share") == 0) {
		shared();
	} else {
		bad_args();
		pause_resume();
	}
	printf(failures ? "%d checks failed\n" : "ok\n", failures);
	return failures != 0;
}
