// Package cuda is the vmm.Driver of NVIDIA GPUs: the CUDA driver API's
// virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess, ...), streams, events, copies and plain allocations.
//
// # Loading
//
// The package has no link-time dependency on CUDA and needs no cuda.h or
// toolkit to build: the few C types it uses are declared in xseg_cuda.h.
// The first [Open] of the process dlopens libcuda.so.1 and calls cuInit(0);
// both outcomes are remembered. Nothing happens in init(). Each [Driver]
// then resolves every entry point once, through cuGetProcAddress with the
// ABI of CUDA 12.0 (so it gets cuMemGetInfo_v2, cuCtxPushCurrent_v2, ...),
// into a symbol table it owns; calls go through one-line C trampolines.
// Only that table (the symtab wrappers, lib_cgo.go and calls_*_cgo.go)
// uses cgo: it turns C's types into Go's and nothing more. The Driver
// itself (contexts to pick, the books, error wrapping, undoing a failed
// step) is plain Go over the table's Go interface (symbols.go), built on
// every platform and tested without a GPU over an in-Go fake of it.
// Without a driver or a device, Open fails with an error that matches
// vmm.ErrNotSupported and carries the reason (dlopen's message, the cuInit
// code). Built without cgo, or off Linux, Open always fails that way.
//
// # Errors
//
// A CUresult is a [Result], an error whose text is the driver's name and
// description of the code and which matches the vmm sentinels through
// errors.Is. Methods wrap it with what they were doing ("cuMemMap
// 0x7f0000000000+2097152 of page 0x5 from offset 0: CUDA_ERROR_...").
// Misuse of the address-range state machine (double release, unmap of
// what is not mapped, overlapping maps, misaligned sizes) and copies
// to memory that is not mapped and accessible are refused from the books
// (vmm/internal/ledger) before the driver sees them: an access fault
// would kill the CUDA context for good.
//
// # Contexts
//
// A CUDA context is current per OS thread. Every call checks the calling
// thread's current context and makes the call it wraps in one cgo
// crossing, so the goroutine cannot change threads in between:
//
//   - If the thread's current context is the one the call needs (PyTorch's
//     threads, where the device's primary context is current), the call
//     runs as is and nothing is changed.
//   - Otherwise the device's primary context is pushed for the call and
//     popped after it, leaving the thread as it found it.
//
// The push and pop cost 35-50 ns a call. Leaving the context current on
// the Go runtime's threads would save them, but Close could then not
// release the contexts for good: it cannot reach those threads.
//
// Calls tied to a device (MemInfo, MemAlloc, streams, events, copies) need
// that device's primary context. The VMM calls are not tied to one: they
// run in whatever context the thread has, or device 0's. Open retains
// device 0's primary context; other devices' are retained when first used.
// Close releases them.
//
// # Streams
//
// Stream 0 is the legacy default stream of the context a call runs in.
// A stream this Driver did not make, such as a cudaStream_t of PyTorch
// handed to an allocator, is passed to the driver as is.
//
// # Concurrency
//
// A Driver is safe for concurrent use by multiple goroutines, except that
// Close must not race with calls in flight.
package cuda
