//go:build linux

package ipc

import (
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
)

// TestLeaseEndUnpinsFirst: when the importer's last Mapping of a share
// closes, the exporter has dropped the lease and unpinned the block by
// the time Close returns, so the producer's next allocation of the size
// gets the same block back at once, with no waiting on its side: for a
// claimed share (ShareBlockOnce, pidfd), and for shares closed after one
// importer through pidfd and through the socket. Many rounds, because
// before the wait for the exporter's close the unpin raced the producer.
func TestLeaseEndUnpinsFirst(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)

	const size = 4 << 20
	for _, tc := range []struct {
		name string
		once bool
		via  Transport
	}{{"claimed", true, TransportPidfd}, {"pidfd", false, TransportPidfd}, {"socket", false, TransportSocket}} {
		t.Run(tc.name, func(t *testing.T) {
			imp, exp := backendDriver(t, "host"), backendDriver(t, "host")
			a := shareableAlloc(t, exp)
			e := newExporter(t, ExporterOptions{})
			im := NewImporter(imp)
			t.Cleanup(func() { require.NoError(t, im.DropKept()) })
			// What is asserted is that the close was awaited, not how
			// soon it came: a loaded machine (CI under -race) may take
			// the exporter past LeaseAckWait.
			opts := OpenOptions{Fetch: FetchOptions{Transports: []Transport{tc.via}, LeaseAckWait: time.Minute}}
			for round := range 30 {
				ptr, err := a.Alloc(size, 0)
				require.NoError(t, err)
				var s *Share
				if tc.once {
					s, err = e.ShareBlockOnce(exp, a, ptr)
				} else if s, err = e.ShareBlock(exp, a, ptr); err == nil {
					err = s.CloseAfter(1, nil)
				}
				require.NoError(t, err)
				desc, err := s.MarshalBinary()
				require.NoError(t, err)
				m, err := im.Open(context.Background(), desc, 0, opts)
				require.NoError(t, err)
				require.Equal(t, tc.once, m.Claimed())
				require.NoError(t, a.Free(ptr), "round %d", round)
				require.NoError(t, m.Close())
				require.Equal(t, 0, s.Leases(), "round %d: the lease is dropped before Close returns", round)
				again, err := a.Alloc(size, 0)
				require.NoError(t, err)
				require.Equal(t, ptr, again, "round %d: the block is free again before Close returns", round)
				require.NoError(t, a.Free(again))
			}
		})
	}
}

// silentListener listens on the abstract name prefix+pid and accepts
// connections it never reads nor closes until the test ends.
func silentListener(t *testing.T, prefix string) string {
	t.Helper()
	name := prefix + strconv.Itoa(os.Getpid())
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
	require.NoError(t, err)
	var held []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		require.NoError(t, ln.Close())
		<-done
		for _, c := range held {
			_ = c.Close()
		}
	})
	return name
}

// TestLeaseEndSilentExporter: an exporter that never closes its end costs
// ending a lease the wait asked for (LeaseAckWait by default) and no more,
// for a dialled connection and for a claimant's raw socket; a negative
// wait does not wait; nothing leaks.
func TestLeaseEndSilentExporter(t *testing.T) {
	requireNoFDLeak(t)
	name := silentListener(t, "@xseg-silent-end-")
	dial := func() *net.UnixConn {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: name, Net: "unixpacket"})
		require.NoError(t, err)
		return c
	}
	raw := func() *handles.FD {
		r, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		require.NoError(t, err)
		fd, err := handles.NewFD(r)
		require.NoError(t, err)
		require.NoError(t, unix.Connect(r, &unix.SockaddrUnix{Name: name}))
		return fd
	}
	for _, tc := range []struct {
		name string
		wait time.Duration
		min  time.Duration
	}{{"default", 0, LeaseAckWait}, {"300ms", 300 * time.Millisecond, 300 * time.Millisecond}, {"none", -1, 0}} {
		for _, c := range []io.Closer{dial(), raw()} {
			t0 := time.Now()
			require.NoError(t, endLease(c, tc.wait), tc.name)
			took := time.Since(t0)
			require.GreaterOrEqual(t, took, tc.min, tc.name)
			require.Less(t, took, tc.min+250*time.Millisecond, tc.name)
			if fd, ok := c.(*handles.FD); ok {
				require.Equal(t, -1, fd.Int(), "closed")
			}
		}
	}
}

// TestLeaseEndGoneExporter: a peer that has closed already (the exporter
// exited) ends the lease at once, and a socket that was never connected,
// or whose half-close fails, is closed without waiting.
func TestLeaseEndGoneExporter(t *testing.T) {
	requireNoFDLeak(t)
	a, b, err := socketPair()
	require.NoError(t, err)
	require.NoError(t, b.Close())
	t0 := time.Now()
	require.NoError(t, endLease(a, 0))
	require.Less(t, time.Since(t0), LeaseAckWait, "the peer's close is seen at once")

	raw, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	require.NoError(t, err)
	fd, err := handles.NewFD(raw)
	require.NoError(t, err)
	t0 = time.Now()
	require.NoError(t, endLease(fd, 0), "never connected: shutdown fails, no wait")
	require.Less(t, time.Since(t0), LeaseAckWait)
}

// socketPair is a connected pair of raw seqpacket sockets.
func socketPair() (*handles.FD, *handles.FD, error) {
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	a, _ := handles.NewFD(p[0])
	b, _ := handles.NewFD(p[1])
	return a, b, nil
}

// TestLeaseEndFloodingExporter: an exporter that keeps sending and never
// closes holds ending the lease no longer than the wait.
func TestLeaseEndFloodingExporter(t *testing.T) {
	requireNoFDLeak(t)
	a, b, err := socketPair()
	require.NoError(t, err)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		msg := []byte("XSRS flood")
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = unix.Write(b.Int(), msg) // EAGAIN when full: the reader drains it
		}
	}()
	t0 := time.Now()
	require.NoError(t, endLease(a, 200*time.Millisecond))
	took := time.Since(t0)
	close(stop)
	<-done
	require.NoError(t, b.Close())
	require.GreaterOrEqual(t, took, 200*time.Millisecond)
	require.Less(t, took, 2*time.Second)
}
