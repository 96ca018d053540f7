// cacheinfo checks xseg_cache_info and xseg_torch_route_cache_info on the
// host backend (1 GiB) against testdata/fake_torch.cc, a library named as
// PyTorch's whose CUDAPluggableAllocator::cacheInfo throws: routing fails
// with a reason before that library is loaded; once it is, the virtual
// call reaches xseg and answers as xseg_cache_info does, the class's other
// virtual methods are untouched, routing again is a no-op, the table's page
// is as write-protected as before, and a bad device throws with xseg's
// reason. Usage: cacheinfo LIBXSEG FAKE_TORCH. Prints "ok" or the failure.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "xseg.h"
#include "testdata/harness_cc.h"

namespace torch {
namespace cuda {
namespace CUDAPluggableAllocator {
class Base {  // the fake's layout, as a caller compiled against it sees it
 public:
	virtual ~Base() = default;
	virtual int before() = 0;
	virtual void cacheInfo(signed char device, size_t* largest) = 0;
	virtual int after() = 0;
};
}  // namespace CUDAPluggableAllocator
}  // namespace cuda
}  // namespace torch
using Base = torch::cuda::CUDAPluggableAllocator::Base;

// writable reports whether the mapping holding addr is writable (-1: none).
static int writable(const void* addr) {
	FILE* f = std::fopen("/proc/self/maps", "r");
	char line[4096];
	int w = -1;
	while (f != nullptr && std::fgets(line, sizeof line, f) != nullptr) {
		unsigned long lo, hi;
		char perms[5] = {0};
		uintptr_t a = reinterpret_cast<uintptr_t>(addr);
		if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && a >= lo && a < hi) {
			w = perms[1] == 'w';
			break;
		}
	}
	if (f != nullptr) std::fclose(f);
	return w;
}

int main(int argc, char** argv) {
	if (argc < 3) FAIL("usage: cacheinfo LIBXSEG FAKE_TORCH");
	void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (h == nullptr) FAIL("dlopen %s: %s", argv[1], dlerror());
	auto route = sym<int (*)(void)>(h, "xseg_torch_route_cache_info");
	auto info = sym<int (*)(int, size_t*)>(h, "xseg_cache_info");
	auto last = sym<const char* (*)(void)>(h, "xseg_last_error");
	auto xmalloc = sym<void* (*)(ssize_t, int, void*)>(h, "xseg_malloc");
	auto xfree = sym<void (*)(void*, ssize_t, int, void*)>(h, "xseg_free");
	auto limit = sym<int (*)(int, unsigned long long)>(h, "xseg_set_memory_limit");
	if (!route || !info || !last || !xmalloc || !xfree || !limit) FAIL("missing symbols");

	// Bad input to xseg_cache_info.
	size_t n = 0;
	if (info(0, nullptr) != -1 || !std::strstr(last(), "largest is NULL")) FAIL("NULL out: %s", last());
	if (info(1, &n) != -1 || !std::strstr(last(), "device 1")) FAIL("device 1 of one: %s", last());
	if (info(-3, &n) != -1) FAIL("device -3 answered");

	// Before PyTorch's library is loaded there is nothing to route.
	if (route() != -1 || !std::strstr(last(), "not among the loaded libraries")) FAIL("route without torch: %s", last());

	void* fake = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
	if (fake == nullptr) FAIL("dlopen %s: %s", argv[2], dlerror());
	Base* obj = sym<Base* (*)(void)>(fake, "fake_make")();
	const void* table = dlsym(fake, "_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE");
	if (obj == nullptr || table == nullptr) FAIL("the fake library");
	int was = writable(table);
	try {
		obj->cacheInfo(0, &n);
		FAIL("the fake's cacheInfo did not throw before routing");
	} catch (const std::runtime_error& e) {
		if (!std::strstr(e.what(), "does not yet support cacheInfo")) FAIL("unexpected: %s", e.what());
	}

	if (route() != 0) FAIL("route: %s", last());
	if (route() != 0) FAIL("route again: %s", last());
	if (writable(table) != was) FAIL("the table's page was %d writable, now %d", was, writable(table));
	if (obj->before() != 7 || obj->after() != 8) FAIL("the other virtual methods changed");

	const size_t G = size_t(1) << 30, M = size_t(1) << 20;
	n = 0;
	obj->cacheInfo(0, &n);
	if (n != G) FAIL("cacheInfo of an empty 1 GiB device: %zu", n);
	void* p = xmalloc(64 * M, 0, nullptr);
	if (p == nullptr) FAIL("malloc: %s", last());
	obj->cacheInfo(0, &n);
	size_t direct = 0;
	if (info(0, &direct) != 0 || n != direct || n != G - 64 * M) FAIL("64 MiB in use: %zu, direct %zu", n, direct);
	if (limit(0, 160 * M) != 0) FAIL("limit: %s", last());
	obj->cacheInfo(0, &n);
	if (n != 96 * M) FAIL("under a 160 MiB limit: %zu", n);
	if (limit(0, 0) != 0) FAIL("no limit: %s", last());
	xfree(p, 64 * M, 0, nullptr);
	obj->cacheInfo(0, &n);
	if (n != G) FAIL("all freed: %zu", n);

	try {
		obj->cacheInfo(5, &n);
		FAIL("device 5 answered");
	} catch (const std::runtime_error& e) {
		if (!std::strstr(e.what(), "xseg: cacheInfo: ") || !std::strstr(e.what(), "device 5")) FAIL("device 5: %s", e.what());
	}
	try {
		obj->cacheInfo(0, nullptr);
		FAIL("NULL answered");
	} catch (const std::runtime_error& e) {
		if (!std::strstr(e.what(), "largest is NULL")) FAIL("NULL: %s", e.what());
	}
	delete obj;
	std::printf("ok\n");
	return 0;
}
