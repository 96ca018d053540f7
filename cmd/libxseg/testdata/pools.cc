// pools loads libxseg.so with dlopen, calls its private-pool hooks as
// PyTorch's CUDAPluggableAllocator does (function pointers of the C++
// signatures, std::function filters) on the host backend, and checks the
// pool rules: a capture's freed temporary goes to nothing outside its pool,
// a second pool gets its own memory, the end of a capture stops the
// routing, a shared pool id shares memory, the last release returns the
// memory, and bad input throws. Usage: pools LIB. Prints "ok" or the failure.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "xseg.h"

#define CHECK(cond, ...)                              \
	do {                                              \
		if (!(cond)) {                                \
			std::printf("FAIL line %d: ", __LINE__); \
			std::printf(__VA_ARGS__);                 \
			std::printf("\n");                        \
			std::exit(1);                             \
		}                                             \
	} while (0)

template <typename T>
T sym(void* h, const char* name) {
	void* p = dlsym(h, name);
	CHECK(p != nullptr, "dlsym %s: %s", name, dlerror());
	return reinterpret_cast<T>(p);
}

// The function-pointer types PyTorch casts the hooks' addresses to.
using BeginFn = void (*)(int, std::pair<unsigned long long, unsigned long long>, std::function<bool(cudaStream_t)>);
using PoolFn = void (*)(int, std::pair<unsigned long long, unsigned long long>);

static long long reserved(void* h) {
	auto stats = sym<char* (*)(int)>(h, "xseg_stats_json");
	auto sfree = sym<void (*)(char*)>(h, "xseg_string_free");
	char* s = stats(0);
	CHECK(s != nullptr, "stats");
	const char* k = std::strstr(s, "\"reserved_bytes\":{\"all\":{\"current\":");
	CHECK(k != nullptr, "no reserved_bytes in %s", s);
	long long v = std::atoll(k + std::strlen("\"reserved_bytes\":{\"all\":{\"current\":"));
	sfree(s);
	return v;
}

static thread_local bool capturing = false;

template <typename F>
static std::string throws(F f) {
	try {
		f();
	} catch (const std::exception& e) {
		return e.what();
	}
	return "";
}

int main(int argc, char** argv) {
	void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	CHECK(h != nullptr, "dlopen: %s", dlerror());
	auto begin = sym<BeginFn>(h, "xseg_begin_allocate_to_pool");
	auto end = sym<PoolFn>(h, "xseg_end_allocate_to_pool");
	auto release = sym<PoolFn>(h, "xseg_release_pool");
	auto m = sym<void* (*)(ssize_t, int, void*)>(h, "xseg_malloc_or_throw");
	auto cm = sym<void* (*)(ssize_t, int, void*)>(h, "xseg_malloc");
	auto f = sym<void (*)(void*, ssize_t, int, void*)>(h, "xseg_free");
	auto empty = sym<int (*)(int)>(h, "xseg_empty_cache");
	auto pj = sym<char* (*)(int, unsigned long long, unsigned long long, int)>(h, "xseg_pool_json");
	auto sfree = sym<void (*)(char*)>(h, "xseg_string_free");
	auto hook = sym<void (*)(void)>(h, "xseg_empty_cache_hook");
	auto lasterr = sym<const char* (*)(void)>(h, "xseg_thread_error");
	std::string e0;

	// The host backend knows only the default stream, so the filter picks
	// the capturing thread's allocations, as torch.compile's graph trees
	// do; "capturing" stands for the thread being the capturing one.
	void* const cap = nullptr;
	void* const other = nullptr;
	auto on = [](void*) { return [](cudaStream_t) { return capturing; }; };
	const ssize_t mib = 1 << 20, sz = 8 * mib;

	void* warm = m(sz, 0, nullptr);  // starts the library
	f(warm, sz, 0, nullptr);
	CHECK(empty(0) == 0, "empty_cache");
	long long base = reserved(h);

	// Graph A: t = x * 2; y = t + 1; t freed inside the capture.
	std::pair<unsigned long long, unsigned long long> A{0, 1}, B{0, 2};
	begin(0, A, on(cap));
	capturing = true;
	void* t = m(sz, 0, cap);
	void* y = m(sz, 0, cap);
	capturing = false;
	void* side = cm(sz, 0, other);  // not the capture's: shared pools
	capturing = true;
	f(t, sz, 0, cap);
	capturing = false;
	end(0, A);
	// empty_cache during a capture: the C call refuses, PyTorch's reset
	// hook returns quietly; neither unmaps anything (a capture records).
	begin(0, B, on(cap));
	long long during = reserved(h);
	CHECK(empty(0) == -1 && std::strstr(lasterr(), "capture is underway"), "empty_cache during a capture: %s", lasterr());
	e0 = throws([&] { hook(); });
	CHECK(e0.empty(), "torch.cuda.empty_cache during a capture threw: '%s'", e0.c_str());
	CHECK(reserved(h) == during, "reserved %lld during the capture, %lld before", reserved(h), during);
	// Graph B on the same stream: w = x * 3 must not get t's block.
	capturing = true;
	void* w = m(sz, 0, cap);
	capturing = false;
	end(0, B);
	CHECK(w != t && w != y && side != t, "w %p t %p y %p side %p", w, t, y, side);
	// After the captures, the same size on the capture stream comes from
	// the shared pools, not from A's freed temporary.
	void* after = m(sz, 0, cap);
	CHECK(after != t && after != w && after != y, "after %p", after);

	char* s = pj(0, A.first, A.second, 0);
	CHECK(s != nullptr && std::strchr(s, ',') == nullptr && std::strlen(s) > 2, "pool A allocations %s", s);
	sfree(s);

	// A capture that shares A's pool may reuse A's freed temporary.
	begin(0, A, on(cap));
	capturing = true;
	void* t2 = m(sz, 0, cap);
	capturing = false;
	end(0, A);
	CHECK(t2 == t, "shared pool: got %p, A's free block was %p", t2, t);
	release(0, A);  // the second capture's use

	// Destroying the graphs gives the memory back.
	long long held = reserved(h);
	f(t2, sz, 0, cap);
	f(y, sz, 0, cap);
	release(0, A);
	long long afterA = reserved(h);
	CHECK(afterA < held, "releasing pool A: reserved %lld -> %lld", held, afterA);
	f(w, sz, 0, cap);
	release(0, B);
	f(side, sz, 0, other);
	f(after, sz, 0, cap);
	CHECK(empty(0) == 0, "empty_cache");
	CHECK(reserved(h) == base, "reserved %lld, before the pools %lld", reserved(h), base);
	void* again = m(sz, 0, nullptr);
	f(again, sz, 0, nullptr);
	CHECK(reserved(h) > base, "a block held again");
	e0 = throws([&] { hook(); });
	CHECK(e0.empty() && reserved(h) == base, "the reset hook outside captures empties the cache: '%s', %lld", e0.c_str(), reserved(h));
	CHECK(pj(0, A.first, A.second, 0) == nullptr, "pool A outlived its release");

	// Bad input throws with a reason.
	std::string e = throws([&] { release(0, A); });
	CHECK(e.find("xseg_release_pool") != std::string::npos, "release of a gone pool: '%s'", e.c_str());
	e = throws([&] { end(0, B); });
	CHECK(e.find("not active") != std::string::npos, "end of an inactive pool: '%s'", e.c_str());
	e = throws([&] { begin(0, A, std::function<bool(cudaStream_t)>()); });
	CHECK(e.find("empty filter") != std::string::npos, "empty filter: '%s'", e.c_str());
	e = throws([&] { begin(-1, A, on(cap)); });
	CHECK(e.find("out of range") != std::string::npos, "device -1: '%s'", e.c_str());
	e = throws([&] { begin(0, {0, 0}, on(cap)); });
	CHECK(e.find("zero id") != std::string::npos, "zero id: '%s'", e.c_str());
	// A filter that throws fails the allocation, not the process.
	begin(0, A, [](cudaStream_t) -> bool { throw std::runtime_error("filter"); });
	capturing = true;
	e = throws([&] { m(sz, 0, cap); });
	CHECK(e.find("stream filter") != std::string::npos, "throwing filter: '%s'", e.c_str());
	CHECK(cm(sz, 0, cap) == nullptr, "xseg_malloc with a throwing filter");
	capturing = false;
	end(0, A);
	release(0, A);

	// A hook's exception gives its own call's reason, whatever other
	// threads fail meanwhile (the hooks threw xseg_last_error, the most
	// recent failure of any thread).
	auto empty_bad = sym<int (*)(int)>(h, "xseg_empty_cache");
	std::atomic<bool> stop{false};
	std::vector<std::thread> noisy;
	for (int k = 0; k < 4; k++) {
		noisy.emplace_back([&] {
			while (!stop.load()) empty_bad(1000);
		});
	}
	int foreign = 0;
	std::string seen;
	for (int i = 0; i < 5000; i++) {
		e = throws([&] { release(0, {0, 77}); });
		if (e.find("releasing pool (0, 77)") == std::string::npos) foreign++, seen = e;
		e = throws([&] { end(0, {0, 77}); });
		if (e.find("ending allocation to pool (0, 77)") == std::string::npos) foreign++, seen = e;
	}
	stop.store(true);
	for (auto& n : noisy) n.join();
	CHECK(foreign == 0, "%d of 10000 hook exceptions gave another thread's failure, as '%s'", foreign, seen.c_str());
	std::printf("ok\n");
	return 0;
}
