// Package vmm is the contract between xseg's allocators and the memory
// backends underneath them.
//
// A backend implements [Driver]: the CUDA driver's virtual-memory management
// API (package vmm/cuda) or the same operations on Linux host memory (package
// vmm/host). Everything above this package (the block core, the expandable
// and fallback allocators, ipc, the benchmarks) speaks only this contract, so
// it runs and is tested without a GPU.
//
// # Address ranges
//
// Device memory is named by [DevicePtr], an integer address, never a Go
// pointer. An address range moves through these states; each Driver method
// documents the transition it makes:
//
//	none ──Reserve──▶ reserved ──Map──▶ mapped ──SetAccess──▶ accessible
//	  ▲                  │  ▲            │                        │
//	  └────Unreserve─────┘  └────Unmap───┴────────────Unmap───────┘
//
// A physical page ([Handle]) exists independently of any range: Create makes
// one, Release destroys it. A page may be mapped at several addresses (and,
// once exported, in several processes); it can be released only once no
// mapping of it remains in this process. A range can be unreserved only once
// nothing in it is mapped. Every backend checks these rules itself (package
// vmm/internal/ledger) and answers a violation with [ErrInvalid] or [ErrInUse]
// before the underlying system sees the call, so the error cases are the same
// on every backend and a misuse never reaches the CUDA driver.
//
// # Errors
//
// Methods return errors that match the sentinels of this package through
// errors.Is ([ErrOutOfMemory], [ErrNotSupported], [ErrInvalid], [ErrInUse],
// [ErrClosed]) while keeping the backend's own cause (a CUresult, an errno)
// reachable through errors.As.
//
// # Concurrency
//
// A Driver is safe for concurrent use by multiple goroutines. Operations on
// the same range or page from two goroutines at once are serialised by the
// ledger; the outcome is that of some order of the two calls.
package vmm
