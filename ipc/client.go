package ipc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// defaultTimeout bounds a socket exchange when the context sets no deadline.
const defaultTimeout = 10 * time.Second

// fetchSocket asks the exporter's socket for the page fds of d. It checks
// that the socket is served by the exporter's pid (an abstract name can be
// taken by anyone), and closes whatever it received if anything fails.
func fetchSocket(ctx context.Context, d *handles.Descriptor) ([]*handles.FD, error) {
	if d.Kind != handles.KindPosixFD {
		return nil, fmt.Errorf("a %s descriptor has no fds to pass: %w", d.Kind, vmm.ErrNotSupported)
	}
	if d.Endpoint == "" {
		return nil, fmt.Errorf("exporter serves no socket: %w", vmm.ErrNotSupported)
	}
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unixpacket", d.Endpoint)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultTimeout)
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	cred, err := peerCred(conn)
	if err != nil {
		return nil, err
	}
	if int(cred.Pid) != d.ExporterPID {
		return nil, fmt.Errorf("socket %q is served by pid %d, not the exporter pid %d: %w", d.Endpoint, cred.Pid, d.ExporterPID, ErrRefused)
	}
	if _, err := conn.Write(encodeRequest(d.Token)); err != nil {
		return nil, fmt.Errorf("sending request: %w", err)
	}
	count, err := readReply(conn, d)
	if err != nil {
		return nil, err
	}
	return readFDs(conn, count)
}

// readReply reads the reply header and turns a refusal into an error.
func readReply(conn *net.UnixConn, d *handles.Descriptor) (int, error) {
	buf := make([]byte, replyHeader+maxMessage+1)
	n, stray, err := recvMsg(conn, buf)
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
	case status != statusOK:
		return 0, fmt.Errorf("exporter pid %d said %q: %w", d.ExporterPID, msg, ErrRefused)
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

func closeRaw(raws []int) {
	for _, raw := range raws {
		_ = unix.Close(raw)
	}
}
