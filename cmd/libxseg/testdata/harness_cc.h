// harness_cc.h: what the C++ test programs of libxseg share (throw.cc,
// cacheinfo.cc): FAIL, which prints the failure and returns 1 from main,
// and sym, a dlsym cast to the function type asked for.
#ifndef XSEG_TEST_HARNESS_CC_H
#define XSEG_TEST_HARNESS_CC_H

#include <dlfcn.h>

#include <cstdio>

#define FAIL(...)                         \
	do {                                  \
		std::printf("FAIL " __VA_ARGS__); \
		std::printf("\n");                \
		return 1;                         \
	} while (0)

template <typename F>
F sym(void* h, const char* name) {
	return reinterpret_cast<F>(dlsym(h, name));
}

#endif
