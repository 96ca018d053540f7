// Package ipc moves shared pages between processes: an exporter shares a
// range of physical pages and hands out a descriptor (package handles); an
// importer fetches the pages named by the descriptor into its own process.
//
// # Exporter
//
// An [Exporter] owns the shares of one process and, unless disabled, serves
// a Unix socket (SOCK_SEQPACKET, an abstract name by default). A [Share] is
// made from page fds ([Exporter.ShareFDs]), fabric handles
// ([Exporter.ShareFabric]) or a live block of an allocator that implements
// [BlockSource] ([Exporter.ShareBlock]: the allocator pins the pages behind
// the block so they are not reused, unmapped or released while shared; the
// share unpins them when it closes). The share keeps its fds open at the
// numbers its descriptor names until [Share.Close], with a small sealed
// authentication memfd that vouches for them (handles.NewAuth). The caller
// sends the descriptor bytes ([Share.MarshalBinary]) any way it likes.
//
// # Transports
//
// [Fetch] tries transports in order, by default pidfd then socket (fabric
// for a fabric descriptor), and returns the first success; when all fail,
// its error names each transport tried and its cause:
//
//   - [TransportPidfd]: pidfd_open(exporter pid) + pidfd_getfd(fd number).
//     Needs ptrace rights over the exporter; in a container without
//     CAP_SYS_PTRACE, or under another uid, it fails with EPERM.
//     [ProbePidfdGetfd] says whether the call exists at all here. A bare
//     fd number is not trusted: once a share closes, its numbers are
//     reused by the next one, and a forged descriptor could name any fd
//     of the exporter. So the importer first fetches the share's
//     authentication memfd, checks that it holds the descriptor's token
//     and fd numbers, checks each page fetched against the identities it
//     lists, and fetches it again at the end: the exporter closes it
//     before the pages, so finding the same file there proves the pages
//     were the share's. A stale or forged descriptor gets
//     [ErrNotOffered]; a descriptor without an authentication fd (wire
//     version 1, an older exporter) is left to the socket.
//   - [TransportSocket]: the importer connects to the descriptor's endpoint,
//     checks that the exporter's pid serves it, and sends the token. The
//     exporter checks the importer's SO_PEERCRED against its [Policy]
//     (same uid, or an allowed list) as soon as it accepts the connection,
//     before reading anything: a refused peer gets "refused by the
//     exporter's policy" ([ErrRefused]; no uid is named) and is closed at
//     once, so connections it holds cost the exporter nothing
//     ([Exporter.Refused] counts them; OnError hears of them about once a
//     second). An admitted peer's exchange waits for one of its uid's 16
//     slots (128 connections of one uid waiting at most; more are turned
//     away), so no uid starves another. The exporter compares the token in
//     constant time ([ErrNotOffered] if no live share has it) and passes
//     the fds with SCM_RIGHTS in batches of at most 253.
//   - [TransportFabric]: the descriptor's bytes are the handles; the
//     importer gives them to vmm.Driver.ImportFabric.
//
// A fetched fd keeps its page alive in the importer after the exporter
// exits or closes the share.
//
// # Other systems
//
// The package builds everywhere, but the pidfd and socket transports are
// Linux calls: elsewhere NewExporter with a socket, the pidfd and socket
// transports and [ProbePidfdGetfd] fail with vmm.ErrNotSupported.
//
// # Lifetime and concurrency
//
// Exporter, Share and Fetch are safe for concurrent use. [Exporter.Close]
// stops accepting, ends exchanges in flight, closes every share and returns
// once every goroutine it started has returned. A [Received] belongs to one
// goroutine; its Close closes the fds it still holds.
//
// # Importer
//
// An [Importer] (one per driver, held by the process that owns the
// driver) maps a descriptor's block into this process with
// [Importer.Open]: it refuses a shared extent larger than the importing
// device's memory (vmm.ErrInvalid: the format allows 2^60 bytes, and the
// extent is reserved whole), fetches the pages, reserves exactly the
// shared extent (its pages times page size, not the device's memory),
// imports each handle into the driver, maps each whole (a handle names a
// physical allocation: one page, or, where the descriptor has spans, the
// several pages of an allocation the driver maps only whole, as the
// expandable allocator's chunks) and grants the device access with one
// SetAccess. Opens of one descriptor through one importer
// for one device with the same access share one mapping, counted by
// reference; the last
// [Mapping.Close] unmaps, releases, unreserves and ends the lease. A
// mapping stays valid after the exporter exits. [Open] opens through an
// importer of its own, which shares with nothing.
//
// An importer made with [NewImporterWith] and [ImporterOptions].KeepFor
// keeps a posix-fd mapping of up to 8 allocations for that long after its
// last Close (lease ended, pages still mapped, its copy of each fd held):
// an Open whose fetched fds are the same open files (kcmp(2): a producer
// that shares the block it reused, whose allocator dups one kept export an
// allocation) takes it over with no reserve, import, map or access grant.
// The lease of the new share protects its reads as for any Open. A kept
// mapping holds its exporter's allocations: memory the exporter releases
// meanwhile returns to the device when the mapping goes (after KeepFor,
// when KeepMax newer ones push it out, or at [Importer.DropKept]).
// cmd/libxseg keeps for XSEG_IMPORT_KEEP_MS (1000 by default) and drops
// them at xseg_empty_cache.
//
// # What an importer can reach
//
// Pages are the unit of sharing: a share exposes every page its block
// touches (every physical allocation: all the pages of a chunk of several),
// read-write unless the importer asks for less
// ([OpenOptions].Access vmm.AccessRead maps it read-only). A 4 KiB block
// of the small pool exposes its whole 2 MiB page, neighbouring blocks
// included; a block of the fallback allocator exposes its whole segment
// (a plain allocation). To share blocks and nothing else, make the
// expandable allocator with Config.WholePages (XSEG_CONF whole_pages:true,
// with shareable:true): every block is then rounded up to whole pages of
// its pool and starts on a page boundary, so the pages a share exposes are
// the block's own (the rounding is the price: a 4 KiB block takes a 2 MiB
// page). The descriptor's Offset 0 shows it.
//
// # Plain allocations
//
// A block of the fallback allocator lives in a plain allocation, which has
// no VMM page handle; ShareBlock shares the whole allocation as one page
// with the block's offset and length in it. On CUDA the page is the
// allocation's legacy IPC handle (a cuda-ipc descriptor, [TransportCUDAIPC]:
// the handle travels in the descriptor, the socket gives the lease); an
// Importer opens it with vmm.Driver.OpenAllocIPC once per handle, shared
// by every descriptor that names it, and refuses it in the exporting
// process ([ErrOwnIPCHandle]). On the host backend the allocation moves
// into a memfd at its first share, and the page is that fd, fetched and
// mapped like any posix-fd page.
//
// # Leases
//
// An importer served by the exporter's socket keeps that connection open
// for as long as it holds the pages: its lease. An importer that fetched
// by pidfd takes a lease-only connection when the exporter serves a socket
// (if the policy refuses it, the pidfd transport fails, so that no
// importer maps pages the exporter does not know it holds). The exporter
// runs a share's release (an allocator's unpin) once the share is closed
// and every lease has ended; the kernel ends the lease of an importer that
// dies. An exporter without a socket cannot see its importers: for it, the
// share's Close is the word that they have let go. Exporter.Close ends
// every lease.
//
// An importer ends its lease by half-closing the connection and waiting,
// up to [FetchOptions.LeaseAckWait] ([LeaseAckWait] by default), for the
// exporter to close its end, which the exporter does only after it has
// dropped the lease. So when an importer's
// last Close returns, the share's release has run if that was its last
// lease: a consumer that then tells its producer it is done (a queue, a
// pipe) never has the producer allocate past a block still pinned. An
// exporter that does not answer in time costs the wait, no more.
//
// A share made for one importer ([Exporter.ShareBlockOnce], as libxseg makes
// one per torch.multiprocessing message) is claimed instead of waited for.
// Its authentication memfd names a claim memfd (handles.ClaimFor). The
// pidfd importer fetches it with the pages, writes its pid and a random
// nonce, seals it and reads back the winner. The exporter serves the share
// to its claimant only, and keeps the pages for it until its lease request
// is served or its process exits, past the share's Close too. So the
// claimant maps and reads without waiting for the exporter's answer
// ([Mapping.Claimed]). A loser of the claim waits as any importer does,
// and is refused.
package ipc
