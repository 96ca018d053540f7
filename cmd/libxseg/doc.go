// Command libxseg is xseg as a C library, built with
//
//	go build -buildmode=c-shared -o libxseg.so ./cmd/libxseg
//
// for PyTorch's pluggable allocator:
//
//	alloc = torch.cuda.memory.CUDAPluggableAllocator("libxseg.so", "xseg_malloc", "xseg_free")
//	torch.cuda.memory.change_current_allocator(alloc)
//
// The Python package xseg (python/, install()) does that and more (stats,
// empty_cache, routing of Tensor.record_stream). The C API is xseg.h in this folder; its functions
// are defined in shim.c, each a call into a Go function of the same name
// spelled xsegGo... that takes and returns integers only, so that no Go
// frame ever holds a C pointer value (a stream handle of 0x1 or 0x2 would
// look like a bad pointer to the Go runtime) and no Go pointer reaches C.
// throw.cc adds xseg_malloc_or_throw, which PyTorch is given instead of
// xseg_malloc: PyTorch does not check a NULL from a pluggable allocator (it
// hands out a tensor at address 0), but it turns a C++ exception into a
// Python RuntimeError. pools.cc holds PyTorch's private-pool hooks (begin
// and end allocating to a pool, release a pool: CUDA graph captures), whose
// C++ signatures take std::function values; it keeps PyTorch's filters and
// routes each allocation the filter accepts to the pool's Go allocator.
// cacheinfo.cc answers PyTorch's cacheInfo (cuDNN's autotuner asks it),
// which the pluggable allocator refuses with no hook to set: at install
// time it points that one entry of the class's virtual table, found by
// mangled name in libtorch_cuda.so, at xseg_cache_info (xseg.h says how).
// Built with CGO_ENABLED=0 the package is a command that only says how to
// build it.
//
// # Lifetime
//
// Loading the library starts the Go runtime and reads XSEG_LOG; nothing
// else. The first xseg_malloc starts the library: it reads the
// configuration (XSEG_CONF and its aliases, with the string of
// xseg_configure applied on top), XSEG_BACKEND ("cuda" by default; "host"
// for CI) and XSEG_HOST_CAPACITY (a multiple of 2 MiB, written as xseg
// replay's --capacity: 24GiB, 512MiB or plain bytes), and opens the driver. A failure to start is kept: every later xseg_malloc returns NULL
// with the same reason, which xseg_last_error reports. A bad value of any of
// these variables is such a failure, XSEG_LOG's included (the log then stays
// off), as for XSEG_BACKEND: a typo is reported, not ignored. Each device
// gets its allocator (xseg.Open over the shared driver) at its first
// allocation; allocators live until the process ends. The first xseg_open
// reads XSEG_IMPORT_KEEP_MS (how long a closed mapping stays for a later
// share of the same memory) and XSEG_LEASE_ACK_MS (how long the close that
// ends a lease waits for the exporter to drop it); a bad value of either
// fails every open, naming the variable.
//
// # Threads and CUDA contexts
//
// Every function may be called from any thread, concurrently. A call from C
// runs on the calling thread, so the CUDA backend works in the CUDA context
// current there (PyTorch's). The hot path (xseg_malloc, xseg_free) finds the
// device's allocator with one atomic load, takes no lock of its own and
// allocates nothing in this layer; failures are the slow path. xseg_free
// does not call into Go at all: it parks the block in a ring in C memory
// (freequeue.h), and every function that calls into Go applies the parked
// frees, in order, before its own work (freequeue.go), so that no call
// finds a block allocated that was freed before it. A full ring, or a
// configuration with release_threshold_mb, frees through Go at once.
//
// # Failures
//
// No function panics into C: each recovers, records the panic as an error
// and returns its failure value. Failures are NULL or -1 and keep their text
// for xseg_last_error (process-wide, the most recent failure of any thread,
// at most 4 KiB of text) and for xseg_thread_error (the calling thread's
// own most recent failure, kept in a thread-local buffer that the failing
// call writes on its caller's thread: what a caller reads right after its
// call failed, whatever other threads do; the Python package reads it).
// Freeing a pointer xseg did not return, or on a device without an
// allocator, records an error and changes nothing.
package main
