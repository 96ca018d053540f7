package ipc

import (
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
)

// serve answers one importer: read its request, check its credentials
// against the policy, find the share by its token, pass the fds.
func (e *Exporter) serve(c *net.UnixConn) error {
	if err := c.SetDeadline(time.Now().Add(e.opts.Timeout)); err != nil {
		return err
	}
	cred, err := peerCred(c)
	if err != nil {
		return err
	}
	// Read the request before answering, so a refusal does not race the
	// importer's write.
	buf := make([]byte, requestSize+1)
	n, stray, err := recvMsg(c, buf)
	closeRaw(stray)
	if err != nil {
		return fmt.Errorf("reading request of pid %d: %w", cred.Pid, err)
	}
	if err := e.opts.Policy.check(e.uid, cred); err != nil {
		_, _ = c.Write(encodeReply(statusRefused, 0, err.Error()))
		return err
	}
	tok, err := decodeRequest(buf[:n])
	if err != nil || len(stray) != 0 {
		_, _ = c.Write(encodeReply(statusBadRequest, 0, "malformed request"))
		return fmt.Errorf("request of pid %d: malformed (%d bytes, %d fds)", cred.Pid, n, len(stray))
	}
	s := e.lookup(tok)
	if s == nil {
		_, _ = c.Write(encodeReply(statusUnknownShare, 0, "no live share has this token"))
		return fmt.Errorf("request of pid %d uid %d: no live share has its token: %w", cred.Pid, cred.Uid, ErrRefused)
	}
	if err := s.send(c, e.opts.batch); err != nil {
		return fmt.Errorf("passing fds to pid %d: %w", cred.Pid, err)
	}
	return nil
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

// send passes the share's fds in batches. It holds the share's read lock so
// Close cannot close the fds under it.
func (s *Share) send(c *net.UnixConn, batch int) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		_, _ = c.Write(encodeReply(statusUnknownShare, 0, "share closed"))
		return fmt.Errorf("share closed: %w", ErrRefused)
	}
	raws := make([]int, len(s.mu.fds))
	for i, fd := range s.mu.fds {
		raws[i] = fd.Int()
	}
	if _, err := c.Write(encodeReply(statusOK, len(raws), "")); err != nil {
		return err
	}
	for i := 0; i*batch < len(raws); i++ {
		part := raws[i*batch : min((i+1)*batch, len(raws))]
		if _, _, err := c.WriteMsgUnix(encodeBatch(i), unix.UnixRights(part...), nil); err != nil {
			return fmt.Errorf("batch %d of %d fds: %w", i, len(part), err)
		}
	}
	return nil
}
