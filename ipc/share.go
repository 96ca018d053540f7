package ipc

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// Extent places a shared block inside its pages.
type Extent struct {
	// DeviceUUID is the device the pages live on (zero for host memory).
	DeviceUUID [16]byte
	// PageSize is the size of every page, a multiple of 4 KiB.
	PageSize uint64
	// Spans, when not nil, has one entry per shared allocation (fd or
	// fabric handle): how many pages of PageSize it holds; importers map
	// each allocation whole. Nil: every allocation is one page.
	Spans []int
	// Offset and Length place the block inside the allocations; Offset is
	// from the start of the first. The allocations must be exactly the
	// block rounded out to allocations.
	Offset, Length uint64
}

// A Share is one range shared by an Exporter. It owns the page fds it
// serves (posix-fd kind) and keeps them open, at the fd numbers its
// descriptor names, until Close. It is safe for concurrent use.
//
// Every importer served through the socket holds a lease on the share for
// as long as it keeps its connection (ipc.Open keeps it until the mapping
// closes; the kernel closes it when the importer dies). The share's
// release (an allocator's unpin) runs once the share is closed and no
// lease is left. Importers that fetched by pidfd from an exporter without
// a socket, and fabric importers, take no lease: for them the share's
// Close is the exporter's word that they have let go.
type Share struct {
	e      *Exporter
	desc   handles.Descriptor
	leases atomic.Int32 // grows under mu's read lock, shrinks under its lock
	// served counts the leases ever granted; limit (0: none) is how many
	// make the share close itself, then calling done (see CloseAfter).
	served, limit atomic.Int32
	ended         atomic.Bool
	done          atomic.Pointer[func()]

	mu struct {
		sync.RWMutex
		closed   bool
		released bool
		fds      []*handles.FD
		// auth is the share's authentication memfd (posix-fd shares;
		// see handles.NewAuth): closed before fds, so that an importer
		// that finds it still open knows the fd numbers were the share's.
		auth    *handles.FD
		release func() error
		// claim is the claim memfd of a share made for one importer
		// (ShareBlockOnce; handles.ClaimFor); heldFor, once the share
		// closed with its claimant not yet served, that claimant: the
		// share keeps one lease for it (the hold) until its request is
		// served or it exits.
		claim   *handles.FD
		heldFor handles.Claimant
	}
	// holdServed is set by the one request the hold is ended by; holdEnd
	// is closed then, for the goroutine that watches the claimant.
	holdServed atomic.Bool
	holdEnd    chan struct{}
	// holdDropped: the hold's lease was dropped, by the claimant's
	// request once served (its own lease then keeps the pages) or by the
	// hold's watcher, whichever came first.
	holdDropped atomic.Bool
}

// exporterNonce is the nonce the exporter claims a share with as it
// closes it (holdLocked): below 1<<63, so no importer's (handles.NewNonce).
const exporterNonce = 1

// pollEvery is how often a hold's watcher looks whether it was ended
// otherwise than by its claimant's exit.
const pollEvery = 100 * time.Millisecond

// ShareFDs shares pages given as fds, one per allocation (of one page of
// ext.PageSize, or of ext.Spans[i] pages), in address order. The share
// takes ownership of fds, also when it fails. release, if not nil, is
// called once when the share closes (an allocator's unpin); when ShareFDs
// fails it has been called already, so the caller must not undo what it
// stands for itself.
// The descriptor carries the fd numbers (for pidfd) and the socket, if the
// exporter serves one.
func (e *Exporter) ShareFDs(fds []*handles.FD, ext Extent, release func() error) (*Share, error) {
	return e.shareFDs(fds, ext, release, false)
}

// shareFDs is ShareFDs; once makes a share for one importer (see
// ShareBlockOnce): it closes after one lease, and, where the exporter
// serves a socket, has a claim memfd.
func (e *Exporter) shareFDs(fds []*handles.FD, ext Extent, release func() error, once bool) (*Share, error) {
	s := &Share{e: e}
	s.mu.fds, s.mu.release = fds, release
	if once {
		s.limit.Store(1)
		if e.endpoint != "" {
			claim, err := handles.NewClaim()
			if err != nil {
				return nil, errors.Join(err, s.Close())
			}
			s.mu.claim = claim
		}
	}
	s.desc = e.descriptor(handles.KindPosixFD, len(fds), ext)
	for _, fd := range fds {
		if fd == nil || fd.Int() < 0 {
			return nil, errors.Join(fmt.Errorf("sharing a closed fd: %w", vmm.ErrInvalid), s.Close())
		}
		s.desc.PageFDs = append(s.desc.PageFDs, fd.Int())
	}
	return s, e.add(s)
}

// ShareFabric shares pages given as fabric handles: the descriptor carries
// them and no transport is involved. release is as for ShareFDs.
func (e *Exporter) ShareFabric(pages []handles.Fabric, ext Extent, release func() error) (*Share, error) {
	s := &Share{e: e}
	s.mu.release = release
	s.desc = e.descriptor(handles.KindFabric, len(pages), ext)
	s.desc.Endpoint = ""
	s.desc.Fabric = append([]handles.Fabric(nil), pages...)
	return s, e.add(s)
}

func (e *Exporter) descriptor(kind handles.Kind, pages int, ext Extent) handles.Descriptor {
	return handles.Descriptor{
		Kind: kind, ExporterPID: os.Getpid(), DeviceUUID: ext.DeviceUUID,
		PageSize: ext.PageSize, PageCount: pages, Spans: handles.NormalSpans(ext.Spans),
		Offset: ext.Offset, Length: ext.Length,
		Endpoint: e.endpoint,
	}
}

// add gives s its token and, for fd numbers, its authentication memfd,
// validates it and registers it; on failure it closes s.
func (e *Exporter) add(s *Share) error {
	tok, err := handles.NewToken()
	if err == nil {
		s.desc.Token = tok
		err = s.authenticate()
	}
	if err == nil {
		err = s.desc.Validate()
	}
	if err == nil {
		e.mu.Lock()
		if e.mu.closed {
			err = errClosedExporter()
		} else {
			e.mu.shares[s] = struct{}{}
		}
		e.mu.Unlock()
	}
	if err != nil {
		return errors.Join(fmt.Errorf("sharing %d pages: %w", s.desc.PageCount, err), s.Close())
	}
	return nil
}

// authenticate makes the authentication memfd of a share of fd numbers:
// without it pidfd_getfd would trust the numbers blindly, and after Close
// they may name another share's page or any file of this process.
func (s *Share) authenticate() error {
	if len(s.desc.PageFDs) == 0 {
		return nil
	}
	auth, err := handles.NewAuth(s.desc.Token, s.mu.fds, s.mu.claim)
	if err != nil {
		return err
	}
	s.mu.auth = auth
	s.desc.AuthFD, s.desc.HasAuth = auth.Int(), true
	return nil
}

// Descriptor returns a copy of the share's descriptor.
func (s *Share) Descriptor() *handles.Descriptor {
	d := s.desc
	d.PageFDs = append([]int(nil), s.desc.PageFDs...)
	d.Fabric = append([]handles.Fabric(nil), s.desc.Fabric...)
	d.Spans = handles.NormalSpans(s.desc.Spans)
	return &d
}

// MarshalBinary returns the descriptor in its wire form, the bytes the
// caller hands to importers any way it likes.
func (s *Share) MarshalBinary() ([]byte, error) { return s.desc.MarshalBinary() }

// CloseAfter makes the share close itself once n importers (n > 0) have
// taken a lease in all, counting those before the call, and then call
// done (if not nil): a share meant for a known number of importers (one
// per message, as torch.multiprocessing sends) ends without the exporter
// having to learn when they came. Each importer keeps the pages until it
// lets go. Only importers that take a lease count: with an exporter
// without a socket (ExporterOptions.NoSocket) none do and the share stays
// until Close.
func (s *Share) CloseAfter(n int, done func()) error {
	if n <= 0 || n > 1<<30 {
		return fmt.Errorf("closing after %d importers: %w", n, vmm.ErrInvalid)
	}
	if done != nil {
		s.done.Store(&done)
	}
	s.limit.Store(int32(n))
	s.closeIfServed()
	return nil
}

// admit takes one of the share's importer slots: always when it has no
// limit, else while fewer than the limit have been served (counting those
// being served now, so that two racing importers cannot both take the
// last slot).
func (s *Share) admit() bool {
	lim := s.limit.Load()
	if n := s.served.Add(1); lim > 0 && n > lim {
		s.served.Add(-1)
		return false
	}
	return true
}

// closeIfServed closes the share, once, when its limit of importers is
// reached.
func (s *Share) closeIfServed() {
	lim := s.limit.Load()
	if lim == 0 || s.served.Load() < lim || !s.ended.CompareAndSwap(false, true) {
		return
	}
	if err := s.Close(); err != nil {
		s.e.report(fmt.Errorf("closing a share after its %d importers: %w", lim, err))
	}
	if done := s.done.Swap(nil); done != nil {
		(*done)()
	}
}

// Leases is the number of importers holding a lease on the share now.
func (s *Share) Leases() int { return int(s.leases.Load()) }

// Close stops serving the share and closes its fds. Its release runs now
// if no importer holds a lease, else when the last lease ends. Importers
// keep what they already fetched; new fetches fail. Close is idempotent.
//
// A share made for one importer whose importer claimed it and has not yet
// been served stays held for it: the release waits until that importer's
// request is served and its lease ends, or until it exits, or until the
// exporter closes.
func (s *Share) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil
	}
	s.mu.closed = true
	held := s.holdLocked()
	if !held {
		s.e.forget(s)
	}
	// The authentication memfd first: an importer's pidfd fetch that
	// still finds it open got the share's pages, not what reuses their
	// numbers once they close.
	err := handles.CloseAll([]*handles.FD{s.mu.auth})
	err = errors.Join(err, handles.CloseAll(s.mu.fds), handles.CloseAll([]*handles.FD{s.mu.claim}))
	if s.leases.Load() == 0 {
		err = errors.Join(err, s.releaseLocked())
	}
	return err
}

// holdLocked decides, as the share closes, whether its claim holds it: it
// claims the share for the exporter itself, which wins unless an importer
// claimed first; if one did and was not served, the share keeps one lease
// for it and a goroutine of the exporter watches it (the exporter's wait
// group counts it, so the hold is made only while the exporter is open).
func (s *Share) holdLocked() bool {
	if s.mu.claim == nil || s.served.Load() != 0 {
		return false
	}
	// The exporter's own claim needs no secret: it only has to differ
	// from an importer's, whose nonce has its top bit set.
	self := handles.Claimant{PID: os.Getpid(), Nonce: exporterNonce}
	w, err := handles.ClaimFor(s.mu.claim, self)
	if err != nil || w == self {
		return false
	}
	if !s.e.startHold() {
		return false
	}
	s.mu.heldFor, s.holdEnd = w, make(chan struct{})
	s.leases.Add(1)
	go s.watchHold(w, s.holdEnd)
	return true
}

// watchHold ends the hold on s when its claimant has been served, or has
// exited, or the exporter closes.
func (s *Share) watchHold(w handles.Claimant, end <-chan struct{}) {
	defer s.e.wg.Done()
	every := pollEvery
	if s.e.opts.holdPoll > 0 {
		every = s.e.opts.holdPoll
	}
	waitGone(w.PID, every, end, s.e.done)
	s.e.forget(s)
	if s.holdDropped.CompareAndSwap(false, true) {
		s.dropLease()
	}
}

// forget takes s out of the shares the exporter serves.
func (e *Exporter) forget(s *Share) {
	e.mu.Lock()
	delete(e.mu.shares, s)
	e.mu.Unlock()
}

// startHold counts a hold's watcher in the exporter's wait group, unless
// the exporter is closed (its Close ends every hold).
func (e *Exporter) startHold() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return false
	}
	e.wg.Add(1)
	return true
}

// dropLease ends one importer's lease and runs the release if it was the
// last one of a closed share. An error of that release goes to OnError.
func (s *Share) dropLease() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases.Add(-1) == 0 && s.mu.closed {
		if err := s.releaseLocked(); err != nil {
			s.e.report(fmt.Errorf("releasing pages after the last lease ended: %w", err))
		}
	}
}

func (s *Share) releaseLocked() error {
	if s.mu.released || s.mu.release == nil {
		return nil
	}
	s.mu.released = true
	return s.mu.release()
}
