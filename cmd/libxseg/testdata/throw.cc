// throw loads libxseg.so with dlopen and checks, on the host backend
// (1 GiB), the functions that throw for PyTorch: xseg_malloc_or_throw gives
// a block when there is room; out of memory is caught as PyTorch catches it,
// by a `catch (c10::OutOfMemoryError&)` of a class of the same name declared
// here (as PyTorch's headers declare it, not xseg's), with a message that
// starts "CUDA out of memory."; other failures are std::runtime_error; and
// the empty-cache, record-stream and memory-fraction hooks. Usage: throw
// LIB. Prints "ok" or the failure.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "freequeue.h"
#include "xseg.h"
#include "testdata/harness_cc.h"

// PyTorch's exception classes as a program built against libc10 sees them:
// only the names and the virtual what_without_backtrace matter here.
namespace c10 {
class Error : public std::exception {
 public:
	virtual const char* what_without_backtrace() const noexcept = 0;
};
class OutOfMemoryError : public Error {};
}  // namespace c10

int main(int argc, char** argv) {
	void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) FAIL("dlopen: %s", dlerror());
	auto m = sym<decltype(&xseg_malloc_or_throw)>(h, "xseg_malloc_or_throw");
	auto f = sym<decltype(&xseg_free)>(h, "xseg_free");
	auto empty = sym<decltype(&xseg_empty_cache_hook)>(h, "xseg_empty_cache_hook");
	auto record = sym<decltype(&xseg_record_stream_hook)>(h, "xseg_record_stream_hook");
	auto fraction = sym<decltype(&xseg_memory_fraction_hook)>(h, "xseg_memory_fraction_hook");
	if (!m || !f || !empty || !record || !fraction) FAIL("dlsym: %s", dlerror());
	if (dlsym(h, "_ZTIN3c1016OutOfMemoryErrorE") != nullptr) FAIL("libxseg exports c10's type info");

	void* p = m(1 << 20, 0, nullptr);
	if (!p || m(0, 0, nullptr) != nullptr) FAIL("1 MiB gave %p", p);
	record(p, nullptr);                                     // the block's own stream
	record(reinterpret_cast<void*>(0x1000), nullptr);       // not xseg's: quiet
	try {
		record(p, reinterpret_cast<cudaStream_t>(0x77));  // xseg's block, a stream that is not live
		FAIL("recording a stream that is not live did not throw");
	} catch (const std::runtime_error& e) {
		if (!std::strstr(e.what(), "stream 0x77 cannot be used on device 0: ")) FAIL("record_stream: %s", e.what());
	}
	f(p, 1 << 20, 0, nullptr);
	empty();

	// PyTorch's path takes a parked block back as xseg_malloc does
	// (takeback.c has the rules): the same request again gets the block
	// without Go, and the library counts it.
	auto fq = static_cast<struct xseg_fq*>(dlsym(h, "xseg_fq"));
	if (!fq) FAIL("dlsym xseg_fq: %s", dlerror());
	void* small = m(4096, 0, nullptr);
	f(small, 4096, 0, nullptr);
	uint64_t before = __atomic_load_n(&fq->reused, __ATOMIC_ACQUIRE);
	void* again = m(4096, 0, nullptr);
	if (again != small || __atomic_load_n(&fq->reused, __ATOMIC_ACQUIRE) != before + 1)
		FAIL("4 KiB again: %p for %p, %llu taken back", again, small,
		     static_cast<unsigned long long>(__atomic_load_n(&fq->reused, __ATOMIC_ACQUIRE) - before));
	f(again, 4096, 0, nullptr);

	// Out of memory: caught as c10::OutOfMemoryError, PyTorch's message.
	for (ssize_t size : {ssize_t(2) << 30, ssize_t(1) << 45}) {
		try {
			void* q = m(size, 0, nullptr);
			FAIL("%zd bytes gave %p, no exception", size, q);
		} catch (const c10::OutOfMemoryError& e) {
			if (std::strncmp(e.what_without_backtrace(), "CUDA out of memory. Tried to allocate ", 38) != 0 ||
			    std::strcmp(e.what(), e.what_without_backtrace()) != 0 || !std::strstr(e.what(), "xseg: "))
				FAIL("OOM message: %s", e.what());
			std::printf("%s\n", e.what());
		} catch (const std::exception& e) {
			FAIL("%zd bytes: not c10::OutOfMemoryError: %s", size, e.what());
		}
	}
	// Other failures: std::runtime_error, not OOM.
	try {
		m(-5, 0, nullptr);
		FAIL("-5 bytes: no exception");
	} catch (const c10::OutOfMemoryError& e) {
		FAIL("-5 bytes thrown as OOM: %s", e.what());
	} catch (const std::runtime_error& e) {
		if (!std::strstr(e.what(), "negative size") || !std::strstr(e.what(), "xseg_malloc: "))
			FAIL("exception %s", e.what());
	}

	// The memory-fraction hook: a limit of a quarter of the 1 GiB device.
	fraction(0.25, 0);
	try {
		m(ssize_t(300) << 20, 0, nullptr);
		FAIL("300 MiB past a 256 MiB limit: no exception");
	} catch (const c10::OutOfMemoryError& e) {
		if (!std::strstr(e.what(), "limit")) FAIL("limit OOM message: %s", e.what());
	}
	void* q = m(ssize_t(200) << 20, 0, nullptr);
	if (!q) FAIL("200 MiB under a 256 MiB limit");
	f(q, 0, 0, nullptr);
	for (double bad : {-0.5, 1.5}) {
		try {
			fraction(bad, 0);
			FAIL("fraction %g accepted", bad);
		} catch (const std::runtime_error& e) {
		}
	}
	try {
		fraction(0.5, 99);
		FAIL("fraction of device 99 accepted");
	} catch (const std::runtime_error& e) {
	}
	fraction(1.0, 0);
	q = m(ssize_t(300) << 20, 0, nullptr);
	if (!q) FAIL("300 MiB after the limit went back to 1.0");
	f(q, 0, 0, nullptr);
	std::printf("ok\n");
	return 0;
}
