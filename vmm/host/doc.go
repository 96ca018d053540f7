// Package host implements the vmm.Driver contract on Linux host memory, for
// real: address ranges are mmap reservations, physical pages are memfd
// memory, mapping is mmap(MAP_FIXED|MAP_SHARED), access is mprotect, and an
// exported page is a file descriptor another process can map. It is the
// embedded default backend: everything above package vmm runs and is tested
// with it on a machine without a GPU.
//
// The package builds on every system, but only Linux has the calls it is
// made of: elsewhere [Open] fails with vmm.ErrNotSupported.
//
// # Devices and capacity
//
// [Open] makes Options.Devices virtual devices of Options.Capacity bytes each
// (141 GiB by default, an H200's; at most [MaxCapacity], 4 TiB, since the
// allocators reserve a device's capacity as address space several times
// over, and x86-64 gives a process 128 TiB). Create and MemAlloc fail with
// vmm.ErrOutOfMemory where they would on the card, yet memory is sparse:
// only bytes written take RAM, so a 25 GB allocation trace replays in a few
// MiB. MemInfo's free memory is the capacity less the pages created (not
// imported) and the plain allocations of the device. Device UUIDs derive
// from the machine's name and the ordinal, the same in every process.
//
// # Pages: one arena per device, a memfd per exportable page
//
// One memfd per page would spend one file descriptor per page, and a large
// replay makes twelve thousand 2 MiB pages while `ulimit -n` may be 20000.
// So the backend keeps two kinds of page:
//
//   - A page created without vmm.HandlePosixFD is an extent of its device's
//     arena: one sparse memfd, as long as the capacity, opened by Open. An
//     extent allocator (a sorted, merged free list) hands out offsets,
//     placing each page right after the previous one when it can, so that
//     pages created one after another and mapped one after another lie
//     contiguous both in the file and in the address space, and the kernel
//     merges their mappings into one VMA (vm.max_map_count, 65530 by
//     default, is the other limit a page-per-mapping design runs into).
//     Release punches the page's bytes out of the file
//     (FALLOC_FL_PUNCH_HOLE), which frees the memory and makes the extent
//     read as zeros when it is handed out again. If fragmentation leaves no
//     extent large enough while the capacity still allows the page, the
//     arena file grows.
//   - A page created with vmm.HandlePosixFD gets a memfd of its own, so that
//     exporting it exposes that page and nothing else of the process.
//     ExportFD duplicates that memfd; ImportFD duplicates the fd it is given
//     and makes a page of the whole file. Such pages cost one fd each. The
//     memfd is sealed at its size (F_SEAL_SHRINK, F_SEAL_GROW,
//     F_SEAL_SEAL), and so is the memfd a shared plain allocation moves
//     into: an importer that truncated it would make every mapping of it,
//     the exporter's too, die of SIGBUS. ImportFD refuses a file without
//     those seals (vmm.ErrInvalid).
//
// # Address ranges
//
// The state machine of package vmm maps onto the kernel as ranges.go says:
// reserved is an anonymous PROT_NONE MAP_NORESERVE mapping, mapped a
// PROT_NONE shared mapping of the page's memfd, accessible the same after
// mprotect. Unmap maps the reservation's kind of mapping back over the
// range, so the addresses stay reserved until Unreserve. Every method
// checks its transition in the books (package vmm/internal/ledger) before
// the system call and puts the books back if the call fails, so misuse is
// vmm.ErrInvalid or vmm.ErrInUse and never a fault.
//
// The host has one protection per mapping for all devices: writable if any
// device was granted read-write access, readable if any was granted read.
// Copies and Memset check that every byte they touch is mapped with the
// protection they need (or lies in a plain allocation) and answer
// vmm.ErrInvalid otherwise, instead of dying of SIGSEGV.
//
// # Streams and events
//
// Every operation is synchronous. Streams and events are validated
// bookkeeping: an event is complete as soon as it is recorded.
//
// # Lifetime and concurrency
//
// A [Driver] is safe for concurrent use. Close closes the driver's file
// descriptors (the arenas and the memfds of exportable and imported pages);
// mappings made before stay valid, since a mapping keeps its file alive,
// but every method called after Close fails with vmm.ErrClosed. What the
// caller still holds (reservations, mappings, plain allocations) is not
// freed by Close; Usage says what it is.
package host
