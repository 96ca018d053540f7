// xseg_malloc_or_throw, for C++ callers that expect allocation failures as
// exceptions: PyTorch's pluggable allocator does not check the pointer its
// malloc function returns, but turns a C++ exception thrown there into a
// Python RuntimeError (as it does for RMM's std::bad_alloc).
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "xseg.h"
#include "_cgo_export.h"

extern "C" void* xseg_malloc_or_throw(ssize_t size, int device, void* stream) {
	char* err = nullptr;
	unsigned long long first = 0, second = 0;
	int routed = xseg_pool_route(device, stream, &first, &second);
	if (routed < 0) {
		throw std::runtime_error("xseg_malloc: the stream filter of an active CUDA graph pool failed");
	}
	uintptr_t st = reinterpret_cast<uintptr_t>(stream);
	uintptr_t p = routed == 1 ? xsegGoMallocInPool(size, device, st, first, second, &err)
	                          : xsegGoMallocOrError(size, device, st, &err);
	if (p != 0 || size == 0) {
		return reinterpret_cast<void*>(p);
	}
	std::string msg = err != nullptr ? err : xseg_last_error();
	std::free(err);
	throw std::runtime_error(msg);
}
