// PyTorch's cacheInfo under xseg (xseg.h: xseg_torch_route_cache_info).
//
// cuDNN's autotuner (torch.backends.cudnn.benchmark) asks the CUDA
// allocator, through c10::cuda::CUDACachingAllocator::cacheInfo, for the
// largest block it could get, to bound the workspaces it tries. PyTorch's
// CUDAPluggableAllocator throws there ("does not yet support cacheInfo")
// and has no hook to set, so every convolution in benchmark mode failed
// with xseg installed. cacheInfo is a virtual method, reached through the
// virtual table of the allocator's class: routing points that table's one
// cacheInfo entry at xseg_torch_cache_info.
//
// It finds the table and PyTorch's method by their mangled names in the
// PyTorch libraries already loaded, and the table's extent from its
// symbol's size; it changes the entry only if the method is there exactly
// once, lifting the page's write protection for the one aligned word
// (atomic on the architectures PyTorch runs on) and putting back the
// protection /proc/self/maps gave. Anything not as expected leaves the
// table as it was and reports why: benchmark mode then fails as before.
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "forked.h"
#include "xseg.h"
#include "_cgo_export.h"

namespace {

// The libraries that may hold the class (PyTorch 2.x builds put it in
// libtorch_cuda.so), by the names their sonames have.
const char* const kLibraries[] = {"libtorch_cuda.so", "libtorch_python.so", "libtorch.so"};
// vtable for torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator
const char kTable[] = "_ZTVN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocatorE";
// torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator::cacheInfo(signed char, unsigned long*)
const char kMethod[] = "_ZN5torch4cuda22CUDAPluggableAllocator22CUDAPluggableAllocator9cacheInfoEaPm";

int refuse(const std::string& why) {
	xsegGoSetError(const_cast<char*>("xseg_torch_route_cache_info"), const_cast<char*>(why.c_str()));
	return -1;
}

// protection returns the PROT_ bits of the mapping that holds addr, or -1.
int protection(uintptr_t addr) {
	FILE* f = std::fopen("/proc/self/maps", "re");
	if (f == nullptr) {
		return -1;
	}
	char line[4096];
	int prot = -1;
	while (std::fgets(line, sizeof line, f) != nullptr) {
		unsigned long lo = 0, hi = 0;
		char perms[5] = {0};
		if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && addr >= lo && addr < hi) {
			prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			       (perms[2] == 'x' ? PROT_EXEC : 0);
			break;
		}
	}
	std::fclose(f);
	return prot;
}

}  // namespace

extern "C" void xseg_torch_cache_info(void* self, signed char device, size_t* largest) {
	if (xseg_forked) {
		throw std::runtime_error(xseg_fork_error);
	}
	(void)self;
	if (xseg_cache_info(device, largest) != 0) {
		throw std::runtime_error(std::string("xseg: cacheInfo: ") + xseg_thread_error());
	}
}

extern "C" int xseg_torch_route_cache_info(void) {
	XSEG_FORK_GUARD(-1);
	void* table = nullptr;
	void* method = nullptr;
	for (const char* name : kLibraries) {
		void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
		if (h == nullptr) {
			continue;
		}
		table = dlsym(h, kTable);
		method = dlsym(h, kMethod);
		dlclose(h);  // RTLD_NOLOAD took a reference
		if (table != nullptr && method != nullptr) {
			break;
		}
	}
	if (table == nullptr || method == nullptr) {
		return refuse("PyTorch's CUDAPluggableAllocator (its virtual table and cacheInfo) is not among the "
		              "loaded libraries' symbols; import torch first");
	}
	Dl_info info;
	void* extra = nullptr;
	int ok = dladdr1(table, &info, &extra, RTLD_DL_SYMENT);
	const ElfW(Sym)* sym = static_cast<const ElfW(Sym)*>(extra);
	if (ok == 0 || sym == nullptr ||
	    sym->st_size < 3 * sizeof(void*)) {
		return refuse("the size of CUDAPluggableAllocator's virtual table is unknown");
	}
	// The table: offset to top, type info, then the entries.
	void** entries = reinterpret_cast<void**>(table) + 2;
	size_t n = sym->st_size / sizeof(void*) - 2;
	void* const ours = reinterpret_cast<void*>(&xseg_torch_cache_info);
	size_t at = 0, found = 0;
	for (size_t i = 0; i < n; i++) {
		void* e = __atomic_load_n(&entries[i], __ATOMIC_ACQUIRE);
		if (e == ours) {
			return 0;  // routed before
		}
		if (e == method) {
			at = i;
			found++;
		}
	}
	if (found != 1) {
		return refuse("CUDAPluggableAllocator's virtual table holds its cacheInfo " + std::to_string(found) +
		              " times, not once; its layout is not the one expected");
	}
	uintptr_t addr = reinterpret_cast<uintptr_t>(&entries[at]);
	int prot = protection(addr);
	if (prot < 0) {
		return refuse("no mapping in /proc/self/maps holds CUDAPluggableAllocator's virtual table");
	}
	long page = sysconf(_SC_PAGESIZE);
	void* start = reinterpret_cast<void*>(addr & ~static_cast<uintptr_t>(page - 1));
	if ((prot & PROT_WRITE) == 0 && mprotect(start, static_cast<size_t>(page), prot | PROT_WRITE) != 0) {
		return refuse(std::string("making the virtual table's page writable: ") + std::strerror(errno));
	}
	__atomic_store_n(&entries[at], ours, __ATOMIC_RELEASE);
	if ((prot & PROT_WRITE) == 0 && mprotect(start, static_cast<size_t>(page), prot) != 0) {
		return refuse(std::string("cacheInfo is routed to xseg, but the virtual table's page stays writable: ") +
		              std::strerror(errno));
	}
	return 0;
}
