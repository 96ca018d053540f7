package ipc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// defaultTimeout bounds a socket exchange when the context sets no deadline.
const defaultTimeout = 10 * time.Second

// fetchSocket asks the exporter's socket for the page fds of d. It checks
// that the socket is served by the exporter's pid (an abstract name can be
// taken by anyone), and closes whatever it received if anything fails. On
// success the connection is the importer's lease, for the caller to close
// when it lets go of the pages.
func fetchSocket(ctx context.Context, d *handles.Descriptor) ([]*handles.FD, *net.UnixConn, error) {
	if d.Kind != handles.KindPosixFD {
		return nil, nil, fmt.Errorf("a %s descriptor has no fds to pass: %w", d.Kind, vmm.ErrNotSupported)
	}
	conn, err := dial(ctx, d)
	if err != nil {
		return nil, nil, err
	}
	done := stopOnCancel(ctx, conn)
	count, err := exchange(conn, d, 0)
	var fds []*handles.FD
	if err == nil {
		fds, err = readFDs(conn, count)
	}
	err = done(err)
	if err == nil {
		err = conn.SetDeadline(time.Time{})
	}
	if err != nil {
		_ = handles.CloseAll(fds)
		_ = conn.Close()
		return nil, nil, err
	}
	return fds, conn, nil
}

// takeLease asks the exporter's socket for a lease on d's share without
// fds (the importer fetched them another way). It returns nil, nil when
// the exporter serves no socket: there is nobody to hold a lease with.
func takeLease(ctx context.Context, d *handles.Descriptor) (*net.UnixConn, error) {
	p, err := askLease(ctx, d, 0)
	if err != nil || p == nil {
		return nil, err
	}
	return p.await(ctx)
}

// A pendingLease is a lease-only request sent and not yet answered: the
// importer maps the pages it fetched by pidfd while the exporter answers.
type pendingLease struct {
	conn *net.UnixConn
	d    *handles.Descriptor
	werr error // of sending the request
}

// askLease connects to d's endpoint, checks that the exporter's pid serves
// it and sends a lease-only request, without waiting for the answer; with
// a non-zero nonce, the request says the importer claimed the share with
// it. It returns nil, nil when the exporter serves no socket.
func askLease(ctx context.Context, d *handles.Descriptor, nonce uint64) (*pendingLease, error) {
	if d.Endpoint == "" {
		return nil, nil
	}
	conn, err := dial(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("taking a lease on socket %q: %w", d.Endpoint, err)
	}
	// A failed send may have a refusal queued behind it: await reads
	// that first (see exchange).
	r := requestMsg{tok: d.Token, flags: flagLeaseOnly}
	if nonce != 0 {
		r.flags, r.nonce = r.flags|flagClaim, nonce
	}
	_, werr := conn.Write(encodeRequest(r))
	return &pendingLease{conn, d, werr}, nil
}

// await reads the answer to the lease request, stopping when ctx ends:
// the connection is then the lease. On failure the connection is closed.
func (p *pendingLease) await(ctx context.Context) (*net.UnixConn, error) {
	done := stopOnCancel(ctx, p.conn)
	count, err := readReply(p.conn, p.d, true)
	if p.werr != nil && !errors.Is(err, ErrRefused) {
		err = fmt.Errorf("sending request: %w", p.werr)
	}
	if err == nil && count != 0 {
		err = fmt.Errorf("exporter offers %d fds to a lease-only request", count)
	}
	err = done(err)
	if err == nil {
		err = p.conn.SetDeadline(time.Time{})
	}
	if err != nil {
		_ = p.conn.Close()
		return nil, fmt.Errorf("taking a lease on socket %q: %w", p.d.Endpoint, err)
	}
	return p.conn, nil
}

// stopOnCancel makes the end of ctx (a cancel, or its deadline) stop the
// exchange on conn at once, not only at conn's deadline: it sets a
// deadline in the past, which wakes every read and write blocked on conn.
// The returned done ends the watch and returns the exchange's error, err
// (nil if it finished), joined with ctx's if ctx ended meanwhile.
func stopOnCancel(ctx context.Context, conn *net.UnixConn) (done func(err error) error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	return func(err error) error {
		switch {
		case stop():
			return err
		case err == nil:
			return fmt.Errorf("socket exchange: %w", ctx.Err())
		}
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
}

// dial connects to d's endpoint, sets the exchange's deadline (ctx's, else
// defaultTimeout from now) and checks that the exporter's pid serves it.
// The caller watches ctx for a cancel (stopOnCancel) while it exchanges.
func dial(ctx context.Context, d *handles.Descriptor) (*net.UnixConn, error) {
	if d.Endpoint == "" {
		return nil, fmt.Errorf("exporter serves no socket: %w", vmm.ErrNotSupported)
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unixpacket", d.Endpoint)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultTimeout)
	}
	err = conn.SetDeadline(deadline)
	var cred *ucred
	if err == nil {
		cred, err = peerCred(conn)
	}
	if err == nil {
		err = servedByExporter(d, cred)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// servedByExporter checks that the peer serving d's socket is d's
// exporter: an abstract name can be taken by anyone.
func servedByExporter(d *handles.Descriptor, cred *ucred) error {
	if int(cred.Pid) != d.ExporterPID {
		return fmt.Errorf("socket %q is served by pid %d, not the exporter pid %d: %w", d.Endpoint, cred.Pid, d.ExporterPID, ErrRefused)
	}
	return nil
}

func exchange(conn *net.UnixConn, d *handles.Descriptor, flags byte) (int, error) {
	_, werr := conn.Write(encodeRequest(requestMsg{tok: d.Token, flags: flags}))
	count, err := readReply(conn, d, flags&flagLeaseOnly != 0)
	if werr != nil && !errors.Is(err, ErrRefused) {
		// A refusal is sent before the request is read, so the write may
		// fail (EPIPE) with the reply that says why already queued: it
		// is the better error. Otherwise the write's is.
		return 0, fmt.Errorf("sending request: %w", werr)
	}
	return count, err
}

// readReply reads the reply header and turns a refusal into an error.
func readReply(conn *net.UnixConn, d *handles.Descriptor, leaseOnly bool) (int, error) {
	buf := make([]byte, replyHeader+maxMessage+1)
	n, stray, err := recvMsg(conn, buf)
	if errors.Is(err, syscall.ECONNRESET) {
		// The exporter closed with our request unread (a refusal): the
		// kernel reports that once, before the reply still queued.
		closeRaw(stray)
		n, stray, err = recvMsg(conn, buf)
	}
	closeRaw(stray)
	if err != nil {
		return 0, fmt.Errorf("reading reply: %w", err)
	}
	if len(stray) != 0 {
		return 0, fmt.Errorf("reply carried %d unexpected fds", len(stray))
	}
	status, count, msg, err := decodeReply(buf[:n])
	switch {
	case err != nil:
		return 0, err
	case status == statusUnknownShare:
		return 0, fmt.Errorf("exporter pid %d said %q: %w", d.ExporterPID, msg, ErrNotOffered)
	case status != statusOK:
		return 0, fmt.Errorf("exporter pid %d said %q: %w", d.ExporterPID, msg, ErrRefused)
	case leaseOnly:
		return count, nil
	case count != d.PageCount:
		return 0, fmt.Errorf("exporter offers %d fds for %d pages", count, d.PageCount)
	}
	return count, nil
}

// readFDs receives count fds in batches; on failure it closes them all.
func readFDs(conn *net.UnixConn, count int) ([]*handles.FD, error) {
	fds := make([]*handles.FD, 0, count)
	buf := make([]byte, batchSize+1)
	for index := 0; len(fds) < count; index++ {
		n, raws, err := recvMsg(conn, buf)
		if err == nil {
			err = checkBatch(buf[:n], index, len(raws), count-len(fds))
		}
		for _, raw := range raws {
			fd, ferr := handles.NewFD(raw)
			err = errors.Join(err, ferr)
			fds = append(fds, fd)
		}
		if err != nil {
			_ = handles.CloseAll(fds)
			return nil, fmt.Errorf("receiving fd batch %d: %w", index, err)
		}
	}
	return fds, nil
}

func checkBatch(b []byte, index, got, left int) error {
	want := string(encodeBatch(index))
	switch {
	case string(b) != want:
		return fmt.Errorf("malformed batch header %q", b)
	case got == 0 || got > maxBatch || got > left:
		return fmt.Errorf("batch of %d fds with %d outstanding", got, left)
	}
	return nil
}
