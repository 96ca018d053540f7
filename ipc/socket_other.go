//go:build !linux

package ipc

import (
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// The socket transport needs Linux (SO_PEERCRED, SOCK_SEQPACKET); elsewhere
// NewExporter refuses to serve it and importers cannot reach one.

var errNoSocket = fmt.Errorf("the socket transport needs Linux, not %s: %w", runtime.GOOS, vmm.ErrNotSupported)

// ucred is a peer's credentials.
type ucred struct {
	Pid      int32
	Uid, Gid uint32
}

func listen(string) (*net.UnixListener, error)          { return nil, errNoSocket }
func rights([]int) []byte                               { return nil }
func closeRaw([]int)                                    {}
func recvMsg(*net.UnixConn, []byte) (int, []int, error) { return 0, nil, errNoSocket }
func peerCred(*net.UnixConn) (*ucred, error)            { return nil, errNoSocket }

func claimLease(*handles.Descriptor, uint64) (*handles.FD, error) { return nil, errNoSocket }

func awaitRawClose(*handles.FD, time.Duration) {}
