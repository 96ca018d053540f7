package ipc

import (
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// The socket transport's system calls: a SOCK_SEQPACKET Unix socket, fds
// passed as SCM_RIGHTS, the peer's SO_PEERCRED. Off Linux,
// socket_other.go answers them with vmm.ErrNotSupported.

// ucred is a peer's credentials.
type ucred = unix.Ucred

// listen serves the socket endpoint ("@name" abstract, else a path).
func listen(endpoint string) (*net.UnixListener, error) {
	return net.ListenUnix("unixpacket", &net.UnixAddr{Name: endpoint, Net: "unixpacket"})
}

// rights is the control message that passes fds.
func rights(fds []int) []byte { return unix.UnixRights(fds...) }

// closeRaw closes fds received from a peer.
func closeRaw(raws []int) {
	for _, raw := range raws {
		_ = unix.Close(raw)
	}
}

// recvMsg reads one message and the fds that came with it. The fds are
// returned even with an error so the caller can close them; a truncated
// message or control block is an error.
func recvMsg(c *net.UnixConn, buf []byte) (int, []int, error) {
	oob := make([]byte, unix.CmsgSpace(maxBatch*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return n, nil, fmt.Errorf("parsing control messages: %w", perr)
		}
		for i := range msgs {
			got, rerr := unix.ParseUnixRights(&msgs[i])
			if rerr == nil {
				fds = append(fds, got...)
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return n, fds, fmt.Errorf("message truncated (flags %#x)", flags)
	}
	return n, fds, nil
}

// peerCred returns the credentials of the process at the other end of c
// (for a client, those of the server when it listened).
func peerCred(c *net.UnixConn) (*ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *ucred
	var cerr error
	err = rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("reading SO_PEERCRED: %w", err)
	}
	return cred, nil
}

// claimLease sends a claimant's lease-only request (see fetchPidfdLeased)
// on a raw socket that it never reads: a socket, a connect, the peer's
// pid checked, one write, where the runtime's dialer would also register
// the socket with its poller. Anything short of that (a full backlog,
// EAGAIN on the write) is an error, and the caller asks the usual way.
// The returned fd is the lease.
func claimLease(d *handles.Descriptor, nonce uint64) (*handles.FD, error) {
	if d.Endpoint == "" {
		return nil, fmt.Errorf("exporter serves no socket: %w", vmm.ErrNotSupported)
	}
	raw, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	fd, err := handles.NewFD(raw)
	if err != nil {
		return nil, err
	}
	if err = unix.Connect(raw, &unix.SockaddrUnix{Name: d.Endpoint}); err == nil {
		var cred *unix.Ucred
		if cred, err = unix.GetsockoptUcred(raw, unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			err = servedByExporter(d, cred)
		}
	}
	if err == nil {
		req := encodeRequest(requestMsg{tok: d.Token, flags: flagLeaseOnly | flagClaim, nonce: nonce})
		var n int
		if n, err = unix.Write(raw, req); err == nil && n != len(req) {
			err = fmt.Errorf("wrote %d of %d bytes", n, len(req))
		}
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("claimant's lease request to %q: %w", d.Endpoint, err), fd.Close())
	}
	return fd, nil
}

// awaitRawClose half-closes the raw socket fd and waits up to wait for
// its peer to close its end, discarding what it reads (see endLease).
func awaitRawClose(fd *handles.FD, wait time.Duration) {
	raw := fd.Int()
	if raw < 0 || unix.Shutdown(raw, unix.SHUT_WR) != nil {
		return
	}
	deadline := time.Now().Add(wait)
	var buf [64]byte
	for {
		n, err := unix.Read(raw, buf[:])
		switch {
		case err == nil && n == 0:
			return // the peer closed
		case err != nil && err != unix.EAGAIN && err != unix.EINTR:
			return
		}
		// Also after a read: a peer that keeps sending must not hold
		// this past the deadline.
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		if err == nil || err == unix.EINTR {
			continue
		}
		pfd := []unix.PollFd{{Fd: int32(raw), Events: unix.POLLIN | unix.POLLRDHUP}}
		if _, err := unix.Poll(pfd, int(left/time.Millisecond)+1); err != nil && err != unix.EINTR {
			return
		}
	}
}
