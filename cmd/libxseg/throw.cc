// The functions of libxseg for C++ callers (PyTorch's CUDAPluggableAllocator)
// that report failure by throwing. PyTorch does not check the pointer a
// pluggable malloc returns, but turns a C++ exception thrown there into a
// Python exception: c10::OutOfMemoryError into torch.OutOfMemoryError (which
// `except torch.cuda.OutOfMemoryError` catches), any other std::exception
// into RuntimeError.
//
// Throwing c10::OutOfMemoryError without PyTorch's headers or libraries:
// a C++ catch clause matches a thrown type by the name in its type_info
// (libstdc++ compares the mangled names), so a class of our own named
// c10::OutOfMemoryError is caught by PyTorch's `catch (c10::OutOfMemoryError&
// e)`. Its data members follow c10::Error's (PyTorch 2.1 to 2.11) in order
// and type, so that code in libc10 that touches them (add_context, msg) finds
// them where it looks, and what() and what_without_backtrace() are virtual
// with c10::Error's vtable order, so PyTorch's translation to Python calls
// ours. The classes are hidden: nothing of them is exported, so they never
// interpose on libc10's own symbols. python/xseg checks the translation at
// install time on the GPU (tests/test_torch_gpu.py) and the C++ test
// program testdata/throw.cc checks the catch by name here.
#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "forked.h"
#include "freequeue.h"
#include "xseg.h"
#include "_cgo_export.h"

namespace c10 {

class __attribute__((visibility("hidden"))) Error : public std::exception {
	std::string msg_;
	std::vector<std::string> context_;
	std::shared_ptr<const void> backtrace_;
	mutable std::atomic<std::string*> what_{nullptr};
	std::string what_without_backtrace_;
	const void* caller_ = nullptr;

 public:
	explicit Error(std::string msg) : msg_(msg), what_without_backtrace_(std::move(msg)) {}
	Error(const Error& o)
	    : std::exception(o), msg_(o.msg_), context_(o.context_), backtrace_(o.backtrace_),
	      what_without_backtrace_(o.what_without_backtrace_), caller_(o.caller_) {}
	~Error() override { delete what_.load(); }
	const char* what() const noexcept override { return what_without_backtrace_.c_str(); }
	virtual const char* what_without_backtrace() const noexcept { return what_without_backtrace_.c_str(); }
};

class __attribute__((visibility("hidden"))) OutOfMemoryError : public Error {
	using Error::Error;
};

}  // namespace c10

namespace {

// raise throws the failure of one allocation: err is C memory from Go.
[[noreturn]] void raise(char* err, int oom) {
	std::string msg = err != nullptr ? err : xseg_thread_error();
	std::free(err);
	if (oom) {
		throw c10::OutOfMemoryError(msg);
	}
	throw std::runtime_error(msg);
}

// refuseForked throws in a child forked after the library loaded (shim.c).
void refuseForked() {
	if (xseg_forked) {
		throw std::runtime_error(xseg_fork_error);
	}
}

}  // namespace

extern "C" void* xseg_malloc_or_throw(ssize_t size, int device, void* stream) {
	refuseForked();
	char* err = nullptr;
	int oom = 0;
	unsigned long long first = 0, second = 0;
	int routed = xseg_pool_route(device, stream, &first, &second);
	if (routed < 0) {
		throw std::runtime_error("xseg_malloc: the stream filter of an active CUDA graph pool failed");
	}
	uintptr_t st = reinterpret_cast<uintptr_t>(stream);
	uintptr_t p = routed == 1 ? xsegGoMallocInPool(size, device, st, first, second, &err, &oom)
	                          : xseg_fq_malloc(size, device, st, &err, &oom);
	if (p != 0 || size == 0) {
		return reinterpret_cast<void*>(p);
	}
	raise(err, oom);
}

extern "C" void xseg_empty_cache_hook(void) {
	refuseForked();
	if (xsegGoEmptyCacheHook() != 0) {
		throw std::runtime_error(std::string("xseg: empty_cache: ") + xseg_thread_error());
	}
}

extern "C" void xseg_record_stream_hook(void* ptr, cudaStream_t stream) {
	refuseForked();
	if (xseg_record_stream(ptr, stream) < 0) {
		throw std::runtime_error(std::string("xseg: record_stream: ") + xseg_thread_error());
	}
}

extern "C" void xseg_memory_fraction_hook(double fraction, int device) {
	refuseForked();
	xseg_set_memory_fraction(fraction, device);
	double now = -1;
	if (xseg_memory_fraction(device, &now) != 0 || now != fraction) {
		throw std::runtime_error(std::string("xseg: set_per_process_memory_fraction: ") + xseg_thread_error());
	}
}
