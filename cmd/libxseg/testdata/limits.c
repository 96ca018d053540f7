// limits loads libxseg.so with dlopen, as PyTorch does, and exercises the
// memory limit and the allocation history of xseg.h on the host backend
// (XSEG_BACKEND=host, XSEG_HOST_CAPACITY of 1 GiB and one device, set by
// the Go test), bad input included. Usage: limits LIB. It prints "ok" and
// exits 0, or prints what failed and exits 1.
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xseg.h"
#include "harness.h"

SYM(xseg_malloc)
SYM(xseg_free)
SYM(xseg_empty_cache)
SYM(xseg_set_memory_fraction)
SYM(xseg_memory_fraction)
SYM(xseg_set_memory_limit)
SYM(xseg_record_history)
SYM(xseg_history_json)


static void load(const char* path) {
	void* h = open_common(path);
	LOAD(h, xseg_malloc) LOAD(h, xseg_free)
	LOAD(h, xseg_empty_cache) LOAD(h, xseg_set_memory_fraction)
	LOAD(h, xseg_memory_fraction) LOAD(h, xseg_set_memory_limit) LOAD(h, xseg_record_history)
	LOAD(h, xseg_history_json)
}



static double fraction(int dev) {
	double f = -1;
	CHECK(p_xseg_memory_fraction(dev, &f) == 0, "memory fraction of device %d", dev);
	return f;
}

static void limits(void) {
	double f = -1;
	CHECK(fraction(0) == 0, "no limit before the library starts");
	CHECK(p_xseg_memory_fraction(0, NULL) == -1 && error_has("NULL"), "out NULL");
	CHECK(p_xseg_memory_fraction(-1, &f) == -1 && error_has("out of range"), "device -1");

	const double bad[] = {-0.5, 1.5, NAN, INFINITY};
	for (int i = 0; i < 4; i++) {
		p_xseg_set_memory_fraction(bad[i], 0);
		CHECK(error_has("not in [0, 1]"), "fraction %g refused", bad[i]);
		CHECK(fraction(0) == 0, "fraction %g changed nothing", bad[i]);
	}
	p_xseg_set_memory_fraction(0.5, 64);
	CHECK(error_has("device 64 out of range"), "device 64 refused");
	p_xseg_set_memory_fraction(0.5, 1);
	CHECK(error_has("has 1 devices"), "device 1 of 1 refused");

	p_xseg_set_memory_fraction(0.0625, 0);  // 64 MiB of 1 GiB
	CHECK(fraction(0) == 0.0625, "fraction set: %g", fraction(0));
	CHECK(top(0, "memory_limit_bytes") == 64LL << 20, "limit in the stats: %lld", top(0, "memory_limit_bytes"));
	void* a = p_xseg_malloc(48 << 20, 0, NULL);
	CHECK(a != NULL, "under the limit");
	void* b = p_xseg_malloc(40 << 20, 0, NULL);
	CHECK(b == NULL, "past the limit");
	CHECK(error_has("out of memory") && error_has("memory limit of 67108864 bytes") && error_has("memory fraction 0.0625"),
	      "the error names the limit");
	CHECK(top(0, "num_ooms") == 1, "an OOM counted");

	CHECK(p_xseg_set_memory_limit(0, 0) == 0, "limit removed");
	CHECK(fraction(0) == 0 && top(0, "memory_limit_bytes") == 0, "no limit");
	b = p_xseg_malloc(200 << 20, 0, NULL);
	CHECK(b != NULL, "no limit now");
	CHECK(p_xseg_set_memory_limit(0, 128ULL << 20) == 0, "limit in bytes, below what is reserved");
	CHECK(fraction(0) == 0.125, "as a fraction: %g", fraction(0));
	p_xseg_free(b, 200 << 20, 0, NULL);
	p_xseg_free(a, 48 << 20, 0, NULL);
	CHECK(p_xseg_empty_cache(0) == 0, "empty cache");
	CHECK(p_xseg_set_memory_limit(64, 1) == -1 && error_has("out of range"), "device 64");
	CHECK(p_xseg_set_memory_limit(0, 0) == 0, "limit removed");
}

// in_order reports whether each needle occurs in s after the one before.
static int in_order(const char* s, const char* const* needles, int n) {
	for (int i = 0; i < n; i++) {
		const char* at = strstr(s, needles[i]);
		if (!at) {
			printf("missing %s in %s\n", needles[i], s);
			return 0;
		}
		s = at + strlen(needles[i]);
	}
	return 1;
}

static void history(void) {
	CHECK(p_xseg_record_history(0, (size_t)1 << 25) == -1 && error_has("more than 16777216"), "max_entries capped");
	CHECK(p_xseg_record_history(-1, 10) == -1 && error_has("out of range"), "device -1");
	CHECK(p_xseg_history_json(-1) == NULL && error_has("out of range"), "history of device -1");
	char* js = p_xseg_history_json(0);
	CHECK(js && strcmp(js, "[]") == 0, "nothing recorded yet: %s", js ? js : "NULL");
	if (js) p_xseg_string_free(js);

	CHECK(p_xseg_record_history(0, 100) == 0, "record");
	void* a = p_xseg_malloc(1000, 0, NULL);
	CHECK(a != NULL, "alloc");
	p_xseg_free(a, 1000, 0, NULL);
	CHECK(p_xseg_empty_cache(0) == 0, "empty cache");
	CHECK(p_xseg_set_memory_limit(0, 1 << 20) == 0, "limit 1 MiB");
	CHECK(p_xseg_malloc(30 << 20, 0, NULL) == NULL, "past the limit");
	CHECK(p_xseg_set_memory_limit(0, 0) == 0, "no limit");
	js = p_xseg_history_json(0);
	CHECK(js != NULL, "history");
	if (js) {
		const char* const want[] = {
		    "{\"action\":\"segment_map\",\"addr\":", ",\"size\":2097152,\"stream\":0,\"time_us\":",
		    "{\"action\":\"alloc\",", "\"size\":1024,",
		    "{\"action\":\"free_requested\",", "{\"action\":\"free_completed\",",
		    "{\"action\":\"segment_unmap\",", "\"size\":2097152,",
		    "{\"action\":\"oom\",\"addr\":0,\"size\":31457280,", "\"device_free\":",
		};
		CHECK(in_order(js, want, sizeof want / sizeof want[0]), "history in order: %s", js);
		CHECK(js[0] == '[' && js[strlen(js) - 1] == ']', "an array: %s", js);
		p_xseg_string_free(js);
	}
	CHECK(p_xseg_record_history(0, 0) == 0, "stop");
	js = p_xseg_history_json(0);
	CHECK(js && strcmp(js, "[]") == 0, "stopped and dropped: %s", js ? js : "NULL");
	if (js) p_xseg_string_free(js);
}

int main(int argc, char** argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: limits LIB\n");
		return 2;
	}
	load(argv[1]);
	limits();
	history();
	if (failures) {
		printf("%d failures\n", failures);
		return 1;
	}
	printf("ok\n");
	return 0;
}
