package ipc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// Transport is a way for an importer to obtain the pages a descriptor names.
type Transport uint8

const (
	// TransportPidfd copies the exporter's page fds with pidfd_open and
	// pidfd_getfd. It needs ptrace rights over the exporter (same uid and
	// no ptrace restriction, or CAP_SYS_PTRACE) and the descriptor's fd
	// numbers.
	TransportPidfd Transport = iota + 1
	// TransportSocket asks the exporter's Unix socket, which checks the
	// importer's credentials and the token and passes the fds with
	// SCM_RIGHTS.
	TransportSocket
	// TransportFabric takes the fabric handles out of the descriptor: the
	// bytes are the handles, nothing moves between processes.
	TransportFabric
	// TransportCUDAIPC takes the CUDA legacy IPC handle out of a cuda-ipc
	// descriptor, and a lease on the exporter's socket when it serves
	// one (a lease-only request, as after pidfd).
	TransportCUDAIPC
)

// transportSpec is what package ipc knows of a transport: adding one is a
// Transport constant and a row of transports.
type transportSpec struct {
	name string
	// fetch obtains d's pages this way.
	fetch func(ctx context.Context, d *handles.Descriptor) (*Received, error)
	// auto are the descriptor kinds for which Fetch tries it when no
	// order is given, in the order of the table.
	auto []handles.Kind
}

// transports are the transports by Transport (index 0 is none).
var transports = [...]transportSpec{
	TransportPidfd:   {name: "pidfd", fetch: fetchPidfdLeased, auto: []handles.Kind{handles.KindPosixFD}},
	TransportSocket:  {name: "socket", fetch: fetchSocketLeased, auto: []handles.Kind{handles.KindPosixFD}},
	TransportFabric:  {name: "fabric", fetch: fetchFabric, auto: []handles.Kind{handles.KindFabric}},
	TransportCUDAIPC: {name: "cuda-ipc", fetch: fetchCUDAIPC, auto: []handles.Kind{handles.KindCUDAIPC}},
}

// spec is t's row, or nil for no transport.
func (t Transport) spec() *transportSpec {
	if t == 0 || int(t) >= len(transports) {
		return nil
	}
	return &transports[t]
}

func (t Transport) String() string {
	if ts := t.spec(); ts != nil {
		return ts.name
	}
	return fmt.Sprintf("Transport(%d)", uint8(t))
}

// autoTransports are the transports Fetch tries for a descriptor of kind k
// when FetchOptions gives none.
func autoTransports(k handles.Kind) []Transport {
	var ts []Transport
	for t := range transports {
		if slices.Contains(transports[t].auto, k) {
			ts = append(ts, Transport(t))
		}
	}
	return ts
}

// ErrRefused: the exporter refused the request (its policy does not admit
// the importer's uid, or the token names no live share).
var ErrRefused = errors.New("refused by exporter")

// ErrNotOffered: the descriptor names nothing its exporter offers now. The
// share was closed (a stale descriptor: its fd numbers may be another
// share's by now), the pid is another process's, or the descriptor was
// forged. Every transport checks it: the socket by the share's token, pidfd
// by the share's authentication memfd. It wraps ErrRefused.
var ErrNotOffered = fmt.Errorf("the descriptor names no share its exporter offers now (closed, or forged): %w", ErrRefused)

// FetchOptions tune Fetch. The zero value chooses automatically.
type FetchOptions struct {
	// Transports are tried in this order until one succeeds. Nil means
	// automatic: fabric for a fabric descriptor, cuda-ipc for a cuda-ipc
	// one, else pidfd then socket.
	Transports []Transport
	// LeaseAckWait bounds how long ending the lease (the importer's last
	// Close, Received.EndLease) waits for the exporter to close its end of
	// the lease's connection, which it does once it has dropped the lease:
	// 0 is LeaseAckWait, a negative value does not wait. Waiting lets a
	// consumer tell its producer it is done knowing the producer has the
	// block back.
	LeaseAckWait time.Duration
}

// Received holds the page handles an importer obtained: one per page, in
// page order, FDs for a posix-fd descriptor and Fabric for a fabric one.
// The FDs are owned by the Received until taken; Close closes those still
// held. A Received is not safe for concurrent use.
type Received struct {
	// Via is the transport that delivered the handles.
	Via Transport
	// FDs are the pages as descriptors of this process (posix-fd kind).
	FDs []*handles.FD
	// Fabric are the pages' fabric handles (fabric kind); the importer
	// passes them to vmm.Driver.ImportFabric.
	Fabric []handles.Fabric
	// IPC is the allocation's CUDA legacy IPC handle (cuda-ipc kind); the
	// importer passes it to vmm.Driver.OpenAllocIPC.
	IPC handles.IPCHandle

	// lease is the connection to the exporter's socket that keeps the
	// share pinned there (a *net.UnixConn, or the raw socket of a
	// claimant's request, see claimLease); nil when the exporter serves
	// no socket.
	lease io.Closer
	// pending is a lease asked for and not yet answered (pidfd: the
	// importer maps while the exporter answers); awaitLease makes it the
	// lease.
	pending *pendingLease
	// ackWait is FetchOptions.LeaseAckWait.
	ackWait time.Duration
	// claimed: this importer won the share's claim (handles.ClaimFor)
	// and its request says so: the exporter holds the pages for it until
	// the request is served, so the answer need not be awaited.
	claimed bool
}

// awaitLease waits for the answer to a pending lease request, stopping
// when ctx ends; it returns nil at once when none is pending, or when the
// share was claimed: the connection is then the lease, answered or not.
// On failure the caller closes r.
func (r *Received) awaitLease(ctx context.Context) error {
	if r.pending == nil {
		return nil
	}
	p := r.pending
	r.pending = nil
	if r.claimed {
		r.lease = p.conn
		return p.conn.SetDeadline(time.Time{})
	}
	lease, err := p.await(ctx)
	r.lease = leaseOf(lease)
	return err
}

// Claimed reports whether the importer won the share's claim: a share made
// for one importer (Exporter.ShareBlockOnce) that the exporter holds for
// this importer alone, so that no answer had to be awaited.
func (r *Received) Claimed() bool { return r.claimed }

// Leased reports whether r holds a lease on the exporter's share: the
// exporter keeps the pages out of reuse until r's Close (or this process's
// death). Without one (an exporter without a socket, fabric handles) the
// exporter's own Share.Close decides.
func (r *Received) Leased() bool { return r.lease != nil }

// Close closes every FD still held and ends the lease. It is idempotent.
func (r *Received) Close() error { return errors.Join(handles.CloseAll(r.FDs), r.EndLease()) }

// EndLease ends r's lease, if it holds one, leaving its FDs open. It
// returns once the exporter has dropped the lease, or after
// FetchOptions.LeaseAckWait (see endLease). It is idempotent.
func (r *Received) EndLease() error {
	if r.pending != nil {
		_ = endLease(r.pending.conn, r.ackWait)
		r.pending = nil
	}
	if r.lease == nil {
		return nil
	}
	err := endLease(r.lease, r.ackWait)
	r.lease = nil
	if err != nil {
		return fmt.Errorf("ending the lease: %w", err)
	}
	return nil
}

// Fetch obtains the pages of d in this process, trying the transports of
// opts in order. When every transport fails, the error names each one
// tried and why it failed (errors.Join, so errors.Is sees every cause:
// unix.EPERM from pidfd_getfd, ErrRefused from the socket, ...). d must
// have been validated (ParseDescriptor does). Fetch is safe for concurrent
// use; ctx bounds the socket exchange.
func Fetch(ctx context.Context, d *handles.Descriptor, opts FetchOptions) (*Received, error) {
	return fetch(ctx, d, opts, false)
}

// fetch is Fetch; with deferLease a pidfd fetch returns with its lease
// asked for and not yet answered: the caller maps the pages meanwhile and
// then calls awaitLease, and reads no byte of them before it succeeds.
func fetch(ctx context.Context, d *handles.Descriptor, opts FetchOptions, deferLease bool) (*Received, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	order := opts.Transports
	if order == nil {
		order = autoTransports(d.Kind)
	}
	var errs []error
	for _, t := range order {
		r, err := fetchVia(ctx, t, d)
		if err == nil {
			r.ackWait = opts.LeaseAckWait
		}
		if err == nil && !deferLease {
			if err = r.awaitLease(ctx); err != nil {
				_ = r.Close()
			}
		}
		if err == nil {
			return r, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", t, err))
	}
	if len(errs) == 0 {
		errs = append(errs, fmt.Errorf("no transport to try: %w", vmm.ErrInvalid))
	}
	return nil, fmt.Errorf("fetching %d %s pages of pid %d: %w", d.PageCount, d.Kind, d.ExporterPID, errors.Join(errs...))
}

func fetchVia(ctx context.Context, t Transport, d *handles.Descriptor) (*Received, error) {
	ts := t.spec()
	if ts == nil {
		return nil, fmt.Errorf("unknown transport: %w", vmm.ErrInvalid)
	}
	return ts.fetch(ctx, d)
}

// fetchPidfdLeased takes the page fds with pidfd_getfd, then asks for a
// lease on the exporter's socket (Fetch waits for the answer; an Open
// maps the pages first). The request must follow the fetch: the exporter
// may close the share (CloseAfter) as soon as it grants the lease.
// Measured and not kept (BenchmarkOpenClose, host backend): connecting
// before the fetch to overlap the exporter's accept with it (Open 61 ->
// 72 us with the exporter on a CPU of its own: the exporter sleeps again
// between accept and request, one more wakeup on the path), and waiting
// for the answer in poll(2) on the calling thread instead of the
// runtime's poller (no better alone, 5-10 us worse with both processes on
// 2 CPUs).
//
// A share made for one importer is claimed between the fetch and the
// request (see handles.ClaimFor): an importer that wins it needs no
// answer before it reads, since the exporter serves nobody else and
// keeps the pages for it until its request is served or it exits. One
// that loses, or cannot claim, asks as any other and awaits the answer
// (a refusal, unless the claimant was an open of its own that failed).
func fetchPidfdLeased(ctx context.Context, d *handles.Descriptor) (*Received, error) {
	fds, claim, err := fetchPidfd(d)
	if err != nil {
		return nil, err
	}
	var nonce uint64
	if claim != nil {
		if d.Endpoint != "" {
			nonce = claimShare(claim)
		}
		_ = claim.Close() // a copy: the exporter's stays
	}
	if nonce != 0 {
		// The claimant never reads the answer: a raw socket will do,
		// without the runtime's poller.
		if lease, err := claimLease(d, nonce); err == nil {
			return &Received{Via: TransportPidfd, FDs: fds, lease: lease, claimed: true}, nil
		}
	}
	pending, err := askLease(ctx, d, nonce)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("fetched the fds, but: %w", err), handles.CloseAll(fds))
	}
	return &Received{Via: TransportPidfd, FDs: fds, pending: pending, claimed: nonce != 0 && pending != nil}, nil
}

// leaseOf is c as a lease: nil (no lease) for a nil connection.
func leaseOf(c *net.UnixConn) io.Closer {
	if c == nil {
		return nil
	}
	return c
}

// claimShare claims the share whose claim memfd is claim for this process
// and returns the nonce it won with, or 0 if it lost or could not claim.
func claimShare(claim *handles.FD) uint64 {
	nonce, err := handles.NewNonce()
	if err != nil {
		return 0
	}
	me := handles.Claimant{PID: os.Getpid(), Nonce: nonce}
	if w, err := handles.ClaimFor(claim, me); err != nil || w != me {
		return 0
	}
	return nonce
}

// fetchSocketLeased asks the exporter's socket for the fds; the connection
// is the lease.
func fetchSocketLeased(ctx context.Context, d *handles.Descriptor) (*Received, error) {
	fds, lease, err := fetchSocket(ctx, d)
	if err != nil {
		return nil, err
	}
	return &Received{Via: TransportSocket, FDs: fds, lease: leaseOf(lease)}, nil
}

// fetchFabric is the fabric hook: the handles travel inside the descriptor,
// so there is nothing to move. Importing them is the driver's job
// (vmm.Driver.ImportFabric), and failing there is the importer's cue to ask
// the exporter for a posix-fd share instead.
func fetchFabric(_ context.Context, d *handles.Descriptor) (*Received, error) {
	if d.Kind != handles.KindFabric {
		return nil, fmt.Errorf("a %s descriptor carries no fabric handles: %w", d.Kind, vmm.ErrNotSupported)
	}
	return &Received{Via: TransportFabric, Fabric: append([]handles.Fabric(nil), d.Fabric...)}, nil
}

// fetchCUDAIPC takes the handle out of a cuda-ipc descriptor and a lease
// on the exporter's socket, if it serves one: the exporter then keeps the
// allocation's block pinned until the importer lets go.
func fetchCUDAIPC(ctx context.Context, d *handles.Descriptor) (*Received, error) {
	if d.Kind != handles.KindCUDAIPC {
		return nil, fmt.Errorf("a %s descriptor carries no CUDA IPC handle: %w", d.Kind, vmm.ErrNotSupported)
	}
	lease, err := takeLease(ctx, d)
	if err != nil {
		return nil, err
	}
	return &Received{Via: TransportCUDAIPC, IPC: d.IPC, lease: leaseOf(lease)}, nil
}
