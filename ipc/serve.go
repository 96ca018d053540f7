package ipc

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/xseg-dev/xseg/handles"
)

// serve answers one importer whose credentials the policy admitted: read
// its request, find the share by its token, pass the fds (none for a
// lease-only request). On success the importer holds a lease on the
// returned share, which the caller must end with Share.dropLease. A peer
// that hangs up before it asks anything gets nil, nil.
func (e *Exporter) serve(c *net.UnixConn, cred *ucred) (*Share, error) {
	if err := c.SetDeadline(time.Now().Add(e.opts.Timeout)); err != nil {
		return nil, err
	}
	buf := make([]byte, requestSize+nonceSize+1)
	n, stray, err := recvMsg(c, buf)
	closeRaw(stray)
	if n == 0 && len(stray) == 0 && (err == nil || errors.Is(err, io.EOF)) {
		// Hung up without a request (an importer that gave up, a
		// probe): nothing was asked, nothing failed.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading request of pid %d: %w", cred.Pid, err)
	}
	req, err := decodeRequest(buf[:n])
	if err != nil || len(stray) != 0 {
		_, _ = c.Write(encodeReply(statusBadRequest, 0, "malformed request"))
		return nil, fmt.Errorf("request of pid %d: malformed (%d bytes, %d fds)", cred.Pid, n, len(stray))
	}
	s := e.lookup(req.tok)
	if s == nil {
		_, _ = c.Write(encodeReply(statusUnknownShare, 0, "no live share has this token"))
		return nil, fmt.Errorf("request of pid %d uid %d: no live share has its token: %w", cred.Pid, cred.Uid, ErrRefused)
	}
	err = s.send(c, e.opts.batch, req, int(cred.Pid))
	s.closeIfServed() // also after a claimant failed: it had its turn
	if err != nil {
		return nil, fmt.Errorf("passing fds to pid %d: %w", cred.Pid, err)
	}
	return s, nil
}

// holdLease keeps the lease of an importer on s until the importer closes
// its end of c (or dies) or the exporter closes c, then ends it.
func (e *Exporter) holdLease(c *net.UnixConn, s *Share) error {
	defer s.dropLease()
	if err := c.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("holding a lease: %w", err)
	}
	buf := make([]byte, 64)
	for {
		if _, err := c.Read(buf); err != nil {
			return nil // EOF, reset, or closed by Close: the lease ends
		}
	}
}

// lookup finds the share with token tok, comparing every token in
// constant time.
func (e *Exporter) lookup(tok handles.Token) *Share {
	e.mu.Lock()
	defer e.mu.Unlock()
	var found *Share
	for s := range e.mu.shares {
		if s.desc.Token.Equal(tok) && found == nil {
			found = s
		}
	}
	return found
}

// send passes the share's fds in batches (none for a lease-only request)
// and takes a lease for the importer, pid peer. It holds the share's read
// lock so Close cannot close the fds under it; on failure it takes no
// lease. A share with a claim is served to its claimant only (see
// claimedBy), and its claimant's turn is spent even if sending fails.
func (s *Share) send(c *net.UnixConn, batch int, req requestMsg, peer int) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.claimedBy(req, peer); err != nil {
		_, _ = c.Write(encodeReply(statusUnknownShare, 0, "the share is held for another importer"))
		return err
	}
	leaseOnly := req.flags&flagLeaseOnly != 0
	held := s.mu.closed && s.mu.heldFor.PID != 0
	if held && (!leaseOnly || !s.holdServed.CompareAndSwap(false, true)) {
		_, _ = c.Write(encodeReply(statusUnknownShare, 0, "share closed"))
		return fmt.Errorf("share closed, held for its claimant, which asked again or for fds: %w", ErrNotOffered)
	}
	if held {
		defer close(s.holdEnd) // the claimant's lease (or failure) ends the hold
	} else if s.mu.closed {
		_, _ = c.Write(encodeReply(statusUnknownShare, 0, "share closed"))
		return fmt.Errorf("share closed: %w", ErrRefused)
	}
	raws := make([]int, 0, len(s.mu.fds))
	for _, fd := range s.mu.fds {
		if !leaseOnly {
			raws = append(raws, fd.Int())
		}
	}
	if !s.admit() {
		_, _ = c.Write(encodeReply(statusUnknownShare, 0, "share closed"))
		return fmt.Errorf("share served its last importer: %w", ErrNotOffered)
	}
	// Counted before the reply goes out, so that an importer that has
	// its answer finds its lease in Leases; under the read lock, so that
	// Close cannot miss it, nor run between it and its undoing.
	s.leases.Add(1)
	if err := s.sendFDs(c, batch, raws); err != nil {
		s.leases.Add(-1)
		if s.mu.claim == nil {
			s.served.Add(-1) // the slot goes to the next importer
		}
		return err
	}
	if held && s.holdDropped.CompareAndSwap(false, true) {
		// The claimant's lease keeps the pages now: the hold's goes at
		// once, not when the watcher next looks, so that the pages are
		// released as soon as the claimant lets go. It cannot be the
		// last lease (the claimant's was added above), so no release
		// runs here, under the read lock.
		s.leases.Add(-1)
	}
	return nil
}

// claimedBy decides whether a share with a claim memfd may serve the
// request of pid peer: only the claimant, as the request names it (its
// nonce), or, for a request that brings none, the peer if the exporter
// can claim the share for it now. nil for a share without a claim.
func (s *Share) claimedBy(req requestMsg, peer int) error {
	if s.mu.claim == nil || s.mu.closed && s.mu.heldFor.PID == 0 {
		return nil // no claim; or closed and held for nobody: send refuses
	}
	want := handles.Claimant{PID: peer, Nonce: req.nonce}
	if req.flags&flagClaim == 0 {
		var err error
		if want.Nonce, err = handles.NewNonce(); err != nil {
			return err
		}
	}
	var w handles.Claimant
	var err error
	if s.mu.closed {
		w = s.mu.heldFor // the claim memfd is closed; zero if not held
	} else if w, err = handles.ClaimFor(s.mu.claim, want); err != nil {
		return fmt.Errorf("claiming the share for pid %d: %w", peer, err)
	}
	if w != want {
		return fmt.Errorf("request of pid %d: the share is held for another importer (pid %d): %w", peer, w.PID, ErrNotOffered)
	}
	return nil
}

func (s *Share) sendFDs(c *net.UnixConn, batch int, raws []int) error {
	if _, err := c.Write(encodeReply(statusOK, len(raws), "")); err != nil {
		return err
	}
	for i := 0; i*batch < len(raws); i++ {
		part := raws[i*batch : min((i+1)*batch, len(raws))]
		if _, _, err := c.WriteMsgUnix(encodeBatch(i), rights(part), nil); err != nil {
			return fmt.Errorf("batch %d of %d fds: %w", i, len(part), err)
		}
	}
	return nil
}
