// harness.h: what the C test programs of libxseg share: CHECK, which
// counts and reports a failure with xseg_last_error (the program declares
// p_xseg_last_error with SYM), and loading the library with dlopen, as
// PyTorch does. Each program declares the functions it uses with SYM and
// loads them with LOAD.
#ifndef XSEG_TEST_HARNESS_H
#define XSEG_TEST_HARNESS_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

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

#endif
