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
	uintptr_t p = xsegGoMallocOrError(size, device, reinterpret_cast<uintptr_t>(stream), &err);
	if (p != 0 || size == 0) {
		return reinterpret_cast<void*>(p);
	}
	std::string msg = err != nullptr ? err : xseg_last_error();
	std::free(err);
	throw std::runtime_error(msg);
}
