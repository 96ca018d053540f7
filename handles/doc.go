// Package handles holds shareable physical-page handles as owned values and
// the wire format that describes a shared range to another process.
//
// # Handles
//
// A page exported as a POSIX file descriptor is an [FD]: an owned descriptor
// with an idempotent Close, Dup for a second owner and Disown to move
// ownership out. A page exported as a fabric handle is a [Fabric]: 64 bytes,
// a plain value that names the page without owning it.
//
// # Descriptors
//
// A [Descriptor] says everything an importer needs to map a shared block:
// the handle kind, the exporter's pid, the device UUID, the page size and
// count, where the block lies inside the pages, the exporter's socket, a
// random token, and the handles themselves where they can travel as bytes
// (fabric handles; for POSIX fds, the exporter's fd numbers for
// pidfd_getfd, with the fd number of the share's authentication memfd that
// vouches for them: see [NewAuth]). Each handle names one physical
// allocation: one page, or, where the descriptor has spans
// ([Descriptor.Spans]), the several pages of an allocation that is mapped
// only whole (the expandable allocator's chunks).
// [Descriptor.MarshalBinary] writes version 3 of the wire format for a
// descriptor with spans, version 2 for one with an authentication fd and
// no spans, and version 1, which older readers read, for any other (see
// wire.go for the layout); [ParseDescriptor] reads all three.
//
// Descriptors arrive from other processes, so ParseDescriptor treats its
// input as hostile: it checks every length before reading, every count
// before allocating, every field against the others (page size a multiple
// of 4 KiB, the block inside the pages without overflow, the allocations
// exactly the block rounded out, handle and span counts matching the page
// count, spans of at least one page and MaxPages in all), rejects
// unknown versions and trailing bytes, and answers every failure with an
// error wrapping vmm.ErrInvalid. It never panics; FuzzParseDescriptor
// checks that, and that parse, marshal, parse gives the same bytes and the
// same value.
//
// A descriptor does not authorise anything by itself: the exporter's socket
// checks the peer's credentials and the token, and pidfd_getfd needs ptrace
// rights over the exporter, and the importer checks what it fetched
// against the share's authentication memfd ([Descriptor.CheckAuth]). Keep
// descriptors as secret as the memory they share.
//
// # Other systems
//
// The package builds everywhere, but descriptors, memfds and their seals
// are Linux calls: elsewhere [FD.Close], [FD.Dup], [NewAuth],
// [Descriptor.CheckAuth], [NewClaim], [ClaimFor] and [FileIDOf] fail with
// vmm.ErrNotSupported.
// Descriptors and fabric handles are plain bytes and work everywhere.
//
// # Concurrency
//
// FD is safe for concurrent use. Fabric, Token and Descriptor are values;
// share them read-only or copy them.
package handles
