package ipc

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// Policy says which peers the exporter's socket serves. The exporter's own
// effective uid is always admitted; UIDs admits more.
type Policy struct {
	// UIDs are further uids allowed to import (e.g. a container's user).
	UIDs []uint32
}

func (p Policy) check(self uint32, c *ucred) error {
	if c.Uid == self {
		return nil
	}
	for _, u := range p.UIDs {
		if c.Uid == u {
			return nil
		}
	}
	return fmt.Errorf("peer pid %d uid %d is not allowed by the exporter's policy: %w", c.Pid, c.Uid, ErrRefused)
}

// refusalMessage is all a refused peer is told: not the exporter's uid,
// not the uids it admits.
const refusalMessage = "refused by the exporter's policy"

// ExporterOptions configure an Exporter. The zero value serves an abstract
// socket with a random name to peers of the same uid.
type ExporterOptions struct {
	// Policy decides which peers the socket serves.
	Policy Policy
	// NoSocket disables the socket: importers can use pidfd or fabric only.
	NoSocket bool
	// Endpoint names the socket: "@name" (abstract, the default with a
	// random name) or a filesystem path, removed on Close. It must fit in
	// a descriptor (handles.CheckEndpoint: at most handles.MaxEndpoint
	// bytes, no NUL), else NewExporter fails with vmm.ErrInvalid.
	Endpoint string
	// Timeout bounds one importer's exchange (default 10 s).
	Timeout time.Duration
	// OnError, if set, is told of every connection that failed, and of
	// refused ones at most about once a second (each report says how many
	// it stands for; Exporter.Refused counts them all); the exporter keeps
	// serving others. It may be called from several goroutines at once.
	OnError func(error)

	batch int // fds per message; tests lower it to exercise batching
	// refuse, if set, refuses the peers it returns true for as the policy
	// would: tests refuse some peers of their own uid with it.
	refuse func(*ucred) bool
	// holdPoll, if set, replaces pollEvery for the exporter's hold
	// watchers: tests raise it to show what does not wait for them.
	holdPoll time.Duration
}

// An Exporter shares pages with other processes and serves its socket
// transport. It is safe for concurrent use. Close stops it: the socket
// stops accepting, exchanges in flight end, every share is closed, and
// every goroutine it started has returned.
type Exporter struct {
	opts     ExporterOptions
	uid      uint32
	ln       *net.UnixListener
	endpoint string
	wg       sync.WaitGroup
	done     chan struct{}

	refused atomic.Uint64
	reports reportLimiter

	mu struct {
		sync.Mutex
		closed bool
		shares map[*Share]struct{}
		conns  map[*net.UnixConn]struct{}
		uids   map[uint32]*uidSlots
	}
}

// Bounds on the exchanges of one uid, so that no uid the policy admits can
// starve the others (refused uids take nothing: they are closed at
// accept). A connection beyond maxOpenPerUID is turned away at once.
const (
	// maxConnsPerUID bounds the exchanges of one uid served at once.
	maxConnsPerUID = 16
	// maxOpenPerUID bounds those waiting or served; leases do not count.
	maxOpenPerUID = 128
)

// uidSlots are one uid's exchanges: sem holds those served, open counts
// those waiting too. Guarded by the Exporter's mu.
type uidSlots struct {
	sem  chan struct{}
	open int
}

// NewExporter starts an exporter and, unless opts.NoSocket, its socket.
func NewExporter(opts ExporterOptions) (*Exporter, error) {
	if opts.batch <= 0 || opts.batch > maxBatch {
		opts.batch = maxBatch
	}
	if opts.Timeout <= 0 {
		opts.Timeout = defaultTimeout
	}
	e := &Exporter{opts: opts, uid: uint32(os.Geteuid()), done: make(chan struct{})}
	e.mu.shares = make(map[*Share]struct{})
	e.mu.conns = make(map[*net.UnixConn]struct{})
	e.mu.uids = make(map[uint32]*uidSlots)
	if opts.NoSocket {
		return e, nil
	}
	if err := handles.CheckEndpoint(opts.Endpoint); err != nil {
		return nil, fmt.Errorf("exporter: %w", err)
	}
	e.endpoint = opts.Endpoint
	if e.endpoint == "" {
		var r [8]byte
		_, _ = rand.Read(r[:])
		e.endpoint = fmt.Sprintf("@xseg-%d-%s", os.Getpid(), hex.EncodeToString(r[:]))
	}
	ln, err := listen(e.endpoint)
	if err != nil {
		return nil, fmt.Errorf("listening on %q: %w", e.endpoint, err)
	}
	e.ln = ln
	e.wg.Add(1)
	go e.accept()
	return e, nil
}

// Endpoint is the socket's name ("" without a socket).
func (e *Exporter) Endpoint() string { return e.endpoint }

// Close stops the exporter and closes every share it still has. Importers
// keep the pages they already hold. Close is idempotent.
func (e *Exporter) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil
	}
	e.mu.closed = true
	close(e.done)
	for c := range e.mu.conns {
		_ = c.Close()
	}
	shares := make([]*Share, 0, len(e.mu.shares))
	for s := range e.mu.shares {
		shares = append(shares, s)
	}
	e.mu.Unlock()
	var errs []error
	if e.ln != nil {
		if err := e.ln.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing socket %q: %w", e.endpoint, err))
		}
	}
	e.wg.Wait()
	for _, s := range shares {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// accept runs the accept loop until Close. It never waits for anything
// but the next connection: a peer the policy refuses is answered and
// closed right here, before anything is read from it, so that holding
// connections open gains it nothing.
func (e *Exporter) accept() {
	defer e.wg.Done()
	for {
		c, err := e.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			e.report(fmt.Errorf("accepting on %q: %w", e.endpoint, err))
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		if !e.admit(c) {
			return
		}
	}
}

// admit checks a new connection's credentials and starts serving it, or
// turns it away. It reports false once the exporter is closed.
func (e *Exporter) admit(c *net.UnixConn) bool {
	cred, err := peerCred(c)
	if err == nil {
		err = e.check(cred)
	}
	if err != nil {
		e.turnAway(c, statusRefused, refusalMessage)
		e.refused.Add(1)
		e.reports.report(e, err)
		return true
	}
	slots, err := e.enter(cred)
	if err != nil {
		e.turnAway(c, statusBusy, "too many connections of this uid")
		e.reports.report(e, err)
		return true
	}
	if !e.track(c) {
		_ = c.Close()
		e.leave(cred.Uid)
		return false
	}
	e.wg.Add(1)
	go e.handle(c, cred, slots)
	return true
}

// check applies the policy (and a test's refusals) to a peer.
func (e *Exporter) check(c *ucred) error {
	if e.opts.refuse != nil && e.opts.refuse(c) {
		return fmt.Errorf("peer pid %d uid %d is refused by the test's policy: %w", c.Pid, c.Uid, ErrRefused)
	}
	return e.opts.Policy.check(e.uid, c)
}

// turnAway answers a connection with a refusal and closes it. The reply
// goes into an empty socket buffer; the deadline only guards the odd case.
func (e *Exporter) turnAway(c *net.UnixConn, status byte, msg string) {
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(encodeReply(status, 0, msg))
	_ = c.Close()
}

// Refused is the number of connections the policy has refused so far.
func (e *Exporter) Refused() uint64 { return e.refused.Load() }

// enter counts one more open exchange of the peer's uid.
func (e *Exporter) enter(c *ucred) (*uidSlots, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	u := e.mu.uids[c.Uid]
	if u == nil {
		u = &uidSlots{sem: make(chan struct{}, maxConnsPerUID)}
		e.mu.uids[c.Uid] = u
	}
	if u.open >= maxOpenPerUID {
		return nil, fmt.Errorf("peer pid %d: uid %d has %d exchanges open already: %w", c.Pid, c.Uid, u.open, ErrRefused)
	}
	u.open++
	return u, nil
}

// leave ends an exchange that enter counted.
func (e *Exporter) leave(uid uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if u := e.mu.uids[uid]; u != nil {
		if u.open--; u.open == 0 {
			delete(e.mu.uids, uid)
		}
	}
}

// handle serves one connection: the exchange, once one of its uid's slots
// is free, then the importer's lease, which takes no slot.
func (e *Exporter) handle(c *net.UnixConn, cred *ucred, slots *uidSlots) {
	defer e.wg.Done()
	defer e.untrack(c)
	s, err := e.exchange(c, cred, slots)
	if err == nil && s != nil {
		err = e.holdLease(c, s)
	}
	if err != nil {
		e.report(err)
	}
}

// exchange waits for a slot of the peer's uid and serves the request. It
// returns nil, nil if the exporter closed meanwhile.
func (e *Exporter) exchange(c *net.UnixConn, cred *ucred, slots *uidSlots) (*Share, error) {
	defer e.leave(cred.Uid)
	select {
	case slots.sem <- struct{}{}:
	case <-e.done:
		return nil, nil
	}
	defer func() { <-slots.sem }()
	return e.serve(c, cred)
}

func (e *Exporter) track(c *net.UnixConn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return false
	}
	e.mu.conns[c] = struct{}{}
	return true
}

func (e *Exporter) untrack(c *net.UnixConn) {
	e.mu.Lock()
	delete(e.mu.conns, c)
	e.mu.Unlock()
	_ = c.Close()
}

func (e *Exporter) report(err error) {
	if e.opts.OnError != nil {
		e.opts.OnError(err)
	}
}

// reportLimiter passes refusals on to OnError at most once per
// refusalReportEvery, each report counting those it stands for: a flood of
// refused connections must not become a flood of reports.
type reportLimiter struct {
	sync.Mutex
	last    time.Time
	skipped uint64
}

const refusalReportEvery = time.Second

func (l *reportLimiter) report(e *Exporter, err error) {
	if e.opts.OnError == nil {
		return
	}
	l.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < refusalReportEvery {
		l.skipped++
		l.Unlock()
		return
	}
	n := l.skipped
	l.last, l.skipped = now, 0
	l.Unlock()
	if n > 0 {
		err = fmt.Errorf("%w (and %d more connections turned away since the last report)", err, n)
	}
	e.report(err)
}

// errClosedExporter is returned by Share* after Close.
func errClosedExporter() error { return fmt.Errorf("exporter: %w", vmm.ErrClosed) }
