package ipc

import (
	"io"
	"net"
	"time"

	"github.com/xseg-dev/xseg/handles"
)

// LeaseAckWait is how long ending a lease waits, by default, for the
// exporter to close its end of the connection (see endLease and
// FetchOptions.LeaseAckWait).
const LeaseAckWait = 20 * time.Millisecond

// endLease ends the lease that connection c holds. It half-closes c, so
// that the exporter reads the end of the lease, and waits up to wait
// (LeaseAckWait if 0; not at all if negative) for the exporter to close
// its end, which the exporter does only once it has dropped the lease:
// unpinned the block if that was the share's last lease. So when the last
// Mapping of a share closes, the producer's next allocation can reuse the
// block at once, and a consumer
// that then tells the producer it is done (a queue, a pipe) never sends
// it past pages still pinned. Whatever the exporter still sends (the
// answer to a lease request, unread) is discarded. An exporter that does
// not answer in time (stopped, or slow) costs the wait and nothing else:
// the lease ends anyway when c closes. c is closed on return; the error
// is its Close's.
func endLease(c io.Closer, wait time.Duration) error {
	if wait == 0 {
		wait = LeaseAckWait
	}
	if wait < 0 {
		return c.Close()
	}
	switch c := c.(type) {
	case *net.UnixConn:
		if c.CloseWrite() == nil && c.SetReadDeadline(time.Now().Add(wait)) == nil {
			var buf [64]byte
			for {
				if _, err := c.Read(buf[:]); err != nil {
					break // EOF: the exporter closed; or the deadline
				}
			}
		}
	case *handles.FD:
		awaitRawClose(c, wait)
	}
	return c.Close()
}
