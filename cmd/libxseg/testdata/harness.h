// harness.h: what the C test programs of libxseg share: CHECK, which
// counts and reports a failure with xseg_last_error, loading the library
// with dlopen, as PyTorch does (open_common), and reading its errors and
// statistics (error_has, top). Include it after xseg.h. Each program
// declares the other functions it uses with SYM and loads them with LOAD.
#ifndef XSEG_TEST_HARNESS_H
#define XSEG_TEST_HARNESS_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYM(name) static __typeof__(name)* p_##name;

static int failures;

#define CHECK(cond, ...)                                              \
	do {                                                              \
		if (!(cond)) {                                                \
			printf("FAIL line %d: %s: ", __LINE__, #cond);            \
			printf(__VA_ARGS__);                                      \
			printf(" (last error: %s)\n", p_xseg_last_error());       \
			failures++;                                               \
		}                                                             \
	} while (0)

// open_lib dlopens the library at path or exits.
static void* open_lib(const char* path) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		printf("FAIL dlopen: %s\n", dlerror());
		exit(1);
	}
	return h;
}

// LOAD sets p_name from library h or exits.
#define LOAD(h, name)                                       \
	p_##name = (__typeof__(name)*)dlsym(h, #name);          \
	if (!p_##name) {                                        \
		printf("FAIL dlsym %s: %s\n", #name, dlerror());    \
		exit(1);                                            \
	}

// The functions the harness itself uses; open_common loads them.
SYM(xseg_last_error)
SYM(xseg_stats_json)
SYM(xseg_string_free)

// open_common dlopens the library at path, loads the harness's functions
// and returns the handle, or exits.
static void* open_common(const char* path) {
	void* h = open_lib(path);
	LOAD(h, xseg_last_error) LOAD(h, xseg_stats_json) LOAD(h, xseg_string_free)
	return h;
}

// error_has reports whether the last error mentions needle.
static int error_has(const char* needle) { return strstr(p_xseg_last_error(), needle) != NULL; }

// top reads a top-level number of device dev's stats JSON; -1 if it has no
// such key.
__attribute__((unused)) static long long top(int dev, const char* name) {
	char* js = p_xseg_stats_json(dev);
	if (!js) return -1;
	char key[128];
	snprintf(key, sizeof key, "\"%s\":", name);
	char* at = strstr(js, key);
	long long v = at ? atoll(at + strlen(key)) : -1;
	p_xseg_string_free(js);
	return v;
}

// stat reads one counter, e.g. stat(0, "allocated_bytes", "current"), from
// the stats JSON's "all" pool; -1 if the JSON has no such key.
__attribute__((unused)) static long long stat(int dev, const char* name, const char* field) {
	char* js = p_xseg_stats_json(dev);
	if (!js) return -1;
	char key[128];
	snprintf(key, sizeof key, "\"%s\":{\"all\":{", name);
	long long v = -1;
	char* at = strstr(js, key);
	if (at) {
		char f[64];
		snprintf(f, sizeof f, "\"%s\":", field);
		char* end = strchr(at, '}');
		char* fa = strstr(at, f);
		if (fa && fa < end) v = atoll(fa + strlen(f));
	}
	p_xseg_string_free(js);
	return v;
}

#endif
