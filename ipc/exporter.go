package ipc

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

// Policy says which peers the exporter's socket serves. The exporter's own
// effective uid is always admitted; UIDs admits more.
type Policy struct {
	// UIDs are further uids allowed to import (e.g. a container's user).
	UIDs []uint32
}

func (p Policy) check(self uint32, c *unix.Ucred) error {
	if c.Uid == self {
		return nil
	}
	for _, u := range p.UIDs {
		if c.Uid == u {
			return nil
		}
	}
	return fmt.Errorf("peer pid %d uid %d is not allowed by the exporter's policy (uid %d and %v): %w", c.Pid, c.Uid, self, p.UIDs, ErrRefused)
}

// ExporterOptions configure an Exporter. The zero value serves an abstract
// socket with a random name to peers of the same uid.
type ExporterOptions struct {
	// Policy decides which peers the socket serves.
	Policy Policy
	// NoSocket disables the socket: importers can use pidfd or fabric only.
	NoSocket bool
	// Endpoint names the socket: "@name" (abstract, the default with a
	// random name) or a filesystem path, removed on Close.
	Endpoint string
	// Timeout bounds one importer's exchange (default 10 s).
	Timeout time.Duration
	// OnError, if set, is told of every connection that failed or was
	// refused; the exporter keeps serving others. It may be called from
	// several goroutines at once.
	OnError func(error)

	batch int // fds per message; tests lower it to exercise batching
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

	mu struct {
		sync.Mutex
		closed bool
		shares map[*Share]struct{}
		conns  map[*net.UnixConn]struct{}
	}
}

// maxConns bounds the exchanges served at once.
const maxConns = 64

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
	if opts.NoSocket {
		return e, nil
	}
	e.endpoint = opts.Endpoint
	if e.endpoint == "" {
		var r [8]byte
		_, _ = rand.Read(r[:])
		e.endpoint = fmt.Sprintf("@xseg-%d-%s", os.Getpid(), hex.EncodeToString(r[:]))
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: e.endpoint, Net: "unixpacket"})
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

// accept runs the accept loop until Close.
func (e *Exporter) accept() {
	defer e.wg.Done()
	sem := make(chan struct{}, maxConns)
	for {
		select {
		case sem <- struct{}{}:
		case <-e.done:
			return
		}
		c, err := e.ln.AcceptUnix()
		if err != nil {
			<-sem
			if errors.Is(err, net.ErrClosed) {
				return
			}
			e.report(fmt.Errorf("accepting on %q: %w", e.endpoint, err))
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		if !e.track(c) {
			_ = c.Close()
			<-sem
			return
		}
		e.wg.Add(1)
		go e.handle(c, sem)
	}
}

// handle serves one connection: the exchange, bounded by sem, then the
// importer's lease, which is not.
func (e *Exporter) handle(c *net.UnixConn, sem chan struct{}) {
	defer e.wg.Done()
	defer e.untrack(c)
	s, err := e.serve(c)
	<-sem
	if err == nil {
		err = e.holdLease(c, s)
	}
	if err != nil {
		e.report(err)
	}
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

// errClosedExporter is returned by Share* after Close.
func errClosedExporter() error { return fmt.Errorf("exporter: %w", vmm.ErrClosed) }
