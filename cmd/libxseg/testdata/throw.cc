// throw loads libxseg.so with dlopen and checks xseg_malloc_or_throw on the
// host backend (1 GiB): a block when there is room, std::runtime_error with
// the reason when there is not. Usage: throw LIB. Prints "ok" or the failure.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "xseg.h"

int main(int argc, char** argv) {
	void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		std::printf("FAIL dlopen: %s\n", dlerror());
		return 1;
	}
	auto m = reinterpret_cast<decltype(&xseg_malloc_or_throw)>(dlsym(h, "xseg_malloc_or_throw"));
	auto f = reinterpret_cast<decltype(&xseg_free)>(dlsym(h, "xseg_free"));
	if (!m || !f) {
		std::printf("FAIL dlsym: %s\n", dlerror());
		return 1;
	}
	void* p = m(1 << 20, 0, nullptr);
	if (!p || m(0, 0, nullptr) != nullptr) {
		std::printf("FAIL: 1 MiB gave %p\n", p);
		return 1;
	}
	f(p, 1 << 20, 0, nullptr);
	const ssize_t sizes[] = {ssize_t(2) << 30, -5};
	const char* want[] = {"out of memory", "negative size"};
	for (int i = 0; i < 2; i++) {
		try {
			void* q = m(sizes[i], 0, nullptr);
			std::printf("FAIL: %zd bytes gave %p, no exception\n", sizes[i], q);
			return 1;
		} catch (const std::runtime_error& e) {
			if (!std::strstr(e.what(), want[i]) || !std::strstr(e.what(), "xseg_malloc: ")) {
				std::printf("FAIL: exception %s\n", e.what());
				return 1;
			}
			std::printf("%s\n", e.what());
		}
	}
	std::printf("ok\n");
	return 0;
}
