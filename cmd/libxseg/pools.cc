// The hooks of PyTorch's CUDAPluggableAllocator for private pools (CUDA
// graph captures), and the routing of allocations to them.
//
// PyTorch calls the hooks through std::function values made from plain
// function pointers, so each hook is an extern "C" function with exactly
// the C++ parameter types PyTorch's setters name:
//
//   set_begin_allocate_to_pool:  void(int, MempoolId_t, std::function<bool(cudaStream_t)>)
//   set_end_allocate_to_pool_fn: void(int, MempoolId_t)
//   set_release_pool:            void(int, MempoolId_t)
//
// where MempoolId_t is std::pair<unsigned long long, unsigned long long>.
// The filter says which allocations belong to the pool (torch.cuda.graph:
// those on the stream being captured; torch.compile's graph trees: those of
// the calling thread). It is C++, so it stays here: begin keeps it, and
// xseg_pool_route asks every kept filter of the device about an allocation,
// in the order begun, as PyTorch's own allocator does. Go keeps the pools.
//
// A hook that fails throws std::runtime_error with xseg's reason: PyTorch
// turns it into a Python RuntimeError at the capture call.
//
// Regions (xseg_begin_region, xseg_end_region) route the calling thread's
// allocations on a device, on every stream, to a tag's pool: python/xseg's
// xseg.region(name). They are kept apart from PyTorch's routes and asked
// after them, innermost (last begun) first, so that a CUDA graph captured
// or a torch.cuda.MemPool used inside a region keeps its own pool (a
// capture's memory must go to nothing outside it). Go is told nothing but
// the tag: a region is no capture, so the allocator neither defers frees
// nor refuses a pause while one is open.
#include <atomic>
#include <exception>
#include <functional>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "forked.h"
#include "xseg.h"
#include "_cgo_export.h"

namespace {

struct Route {
	xseg_pool_id id;
	xseg_stream_filter filter;
};

// Region is an open region: thread's allocations go to tag pool id.
struct Region {
	std::thread::id thread;
	xseg_pool_id id;
};

// DeviceRoutes are the filters of one device's active pools and its open
// regions. active (their number) lets the allocation path skip the lock
// while there are none.
struct DeviceRoutes {
	std::mutex mu;
	std::vector<Route> routes;
	std::vector<Region> regions;
	std::atomic<int> active{0};

	void count() { active.store(static_cast<int>(routes.size() + regions.size()), std::memory_order_release); }
};

// kMaxRegions bounds the open regions of a device (a loop that never ends
// its regions fails instead of growing the list without end).
constexpr size_t kMaxRegions = 1 << 16;

constexpr int kMaxDevices = 64; // as cmd/libxseg's maxDevices
DeviceRoutes g_routes[kMaxDevices];

DeviceRoutes* routes_of(int device) {
	if (device < 0 || device >= kMaxDevices) {
		return nullptr;
	}
	return &g_routes[device];
}

// fail throws the failure of the calling thread's call that just failed:
// xseg_thread_error, not xseg_last_error (another thread's failure may
// have come since).
[[noreturn]] void fail(const char* what) {
	const char* e = xseg_thread_error();
	throw std::runtime_error(std::string(what) + ": " + (e != nullptr ? e : "unknown error"));
}

} // namespace

extern "C" void xseg_begin_allocate_to_pool(int device, xseg_pool_id id, xseg_stream_filter filter) {
	if (xseg_forked) {
		throw std::runtime_error(xseg_fork_error);
	}
	DeviceRoutes* r = routes_of(device);
	if (r == nullptr || !filter) {
		throw std::invalid_argument("xseg_begin_allocate_to_pool: device " + std::to_string(device) +
		                            (r == nullptr ? " out of range" : ": empty filter"));
	}
	if (xsegGoBeginPool(device, id.first, id.second) != 0) {
		fail("xseg_begin_allocate_to_pool");
	}
	std::lock_guard<std::mutex> g(r->mu);
	r->routes.push_back(Route{id, std::move(filter)});
	r->count();
}

extern "C" void xseg_end_allocate_to_pool(int device, xseg_pool_id id) {
	if (xseg_forked) {
		throw std::runtime_error(xseg_fork_error);
	}
	DeviceRoutes* r = routes_of(device);
	if (r != nullptr) {
		std::lock_guard<std::mutex> g(r->mu);
		for (auto it = r->routes.begin(); it != r->routes.end(); ++it) {
			if (it->id == id) {
				r->routes.erase(it);
				break;
			}
		}
		r->count();
	}
	if (xsegGoEndPool(device, id.first, id.second) != 0) {
		fail("xseg_end_allocate_to_pool");
	}
}

extern "C" void xseg_release_pool(int device, xseg_pool_id id) {
	if (xseg_forked) {
		throw std::runtime_error(xseg_fork_error);
	}
	if (xsegGoReleasePool(device, id.first, id.second) != 0) {
		fail("xseg_release_pool");
	}
}

extern "C" int xseg_pool_route(int device, void* stream, unsigned long long* first, unsigned long long* second) {
	XSEG_FORK_GUARD(-1);
	if (first == nullptr || second == nullptr) {
		// Refused whether or not a pool is active: a caller must not
		// find out only once one is.
		xsegGoSetError(const_cast<char*>("xseg_pool_route"), const_cast<char*>("first or second is NULL"));
		return -1;
	}
	DeviceRoutes* r = routes_of(device);
	if (r == nullptr || r->active.load(std::memory_order_acquire) == 0) {
		return 0;
	}
	std::lock_guard<std::mutex> g(r->mu);
	try {
		for (const Route& route : r->routes) {
			if (route.filter(static_cast<cudaStream_t>(stream))) {
				*first = route.id.first;
				*second = route.id.second;
				return 1;
			}
		}
	} catch (const std::exception& e) {
		std::string msg = std::string("a pool's stream filter threw: ") + e.what();
		xsegGoSetError(const_cast<char*>("xseg_pool_route"), const_cast<char*>(msg.c_str()));
		return -1;
	} catch (...) {
		xsegGoSetError(const_cast<char*>("xseg_pool_route"), const_cast<char*>("a pool's stream filter threw"));
		return -1;
	}
	const std::thread::id self = std::this_thread::get_id();
	for (auto it = r->regions.rbegin(); it != r->regions.rend(); ++it) {
		if (it->thread == self) {
			*first = it->id.first;
			*second = it->id.second;
			return 1;
		}
	}
	return 0;
}

extern "C" int xseg_begin_region(int device, const char* tag) {
	XSEG_FORK_GUARD(-1);
	unsigned long long first = 0, second = 0;
	// Checks the name and the device, and makes the tag.
	if (xsegGoTag(device, const_cast<char*>(tag), &first, &second) != 0) {
		return -1;
	}
	DeviceRoutes* r = routes_of(device);
	if (r == nullptr) {
		xsegGoSetError(const_cast<char*>("xseg_begin_region"), const_cast<char*>("device out of range"));
		return -1;
	}
	std::lock_guard<std::mutex> g(r->mu);
	if (r->regions.size() >= kMaxRegions) {
		xsegGoSetError(const_cast<char*>("xseg_begin_region"),
		               const_cast<char*>("65536 regions are open on this device: end some first"));
		return -1;
	}
	r->regions.push_back(Region{std::this_thread::get_id(), xseg_pool_id(first, second)});
	r->count();
	return 0;
}

extern "C" int xseg_end_region(int device) {
	XSEG_FORK_GUARD(-1);
	DeviceRoutes* r = routes_of(device);
	if (r != nullptr) {
		const std::thread::id self = std::this_thread::get_id();
		std::lock_guard<std::mutex> g(r->mu);
		for (auto it = r->regions.rbegin(); it != r->regions.rend(); ++it) {
			if (it->thread == self) {
				r->regions.erase(std::next(it).base());
				r->count();
				return 0;
			}
		}
	}
	std::string msg = "device " + std::to_string(device) +
	                  (r == nullptr ? " out of range" : ": no region is open on this thread");
	xsegGoSetError(const_cast<char*>("xseg_end_region"), const_cast<char*>(msg.c_str()));
	return -1;
}
