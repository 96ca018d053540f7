//go:build linux

package ipc

import (
	"context"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The pidfd fetch and its lease (see fetchPidfdLeased), taken apart.

// reportingExporter is an exporter whose OnError reports are kept.
func reportingExporter(t *testing.T) (*Exporter, func() []error) {
	t.Helper()
	var mu sync.Mutex
	var reports []error
	e := newExporter(t, ExporterOptions{OnError: func(err error) {
		mu.Lock()
		reports = append(reports, err)
		mu.Unlock()
	}})
	return e, func() []error {
		mu.Lock()
		defer mu.Unlock()
		return append([]error(nil), reports...)
	}
}

// TestPidfdFailureIsQuiet: a pidfd fetch that fails (a forged token, an
// fd number that names nothing) gets the fetch's error, leaks nothing,
// makes the exporter report nothing and count no lease, and the real
// descriptor is served afterwards with its lease counted by the time the
// fetch returns.
func TestPidfdFailureIsQuiet(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	e, reports := reportingExporter(t)
	s := smallShare(t, e, 2)
	pidfd := FetchOptions{Transports: []Transport{TransportPidfd}}

	forged := s.Descriptor()
	forged.Token[0] ^= 1
	_, err := Fetch(context.Background(), forged, pidfd)
	require.ErrorIs(t, err, ErrNotOffered)

	gone := s.Descriptor()
	gone.AuthFD = 1 << 20
	_, err = Fetch(context.Background(), gone, pidfd)
	require.ErrorIs(t, err, ErrNotOffered)
	require.ErrorIs(t, err, unix.EBADF)

	r, err := Fetch(context.Background(), s.Descriptor(), pidfd)
	require.NoError(t, err)
	require.True(t, r.Leased())
	require.Equal(t, 1, s.Leases(), "the lease is counted once its answer is in")
	requireSameFiles(t, s, r.FDs)
	require.NoError(t, r.Close())
	require.Eventually(t, func() bool { return s.Leases() == 0 }, 2*time.Second, time.Millisecond)
	require.Empty(t, reports())

	// A peer that connects and hangs up without a request is no error.
	c, err := net.Dial("unixpacket", s.Descriptor().Endpoint)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	time.Sleep(50 * time.Millisecond)
	require.Empty(t, reports(), "a connection closed before a request is no error")
}

// TestPidfdFetchedButNoSocket: the fds come by pidfd but the socket is not
// there to lease them: the fetch fails with the dial's error and closes
// the fds it fetched.
func TestPidfdFetchedButNoSocket(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	s := smallShare(t, e, 2)
	d := s.Descriptor()
	d.Endpoint = "@xseg-nobody-listens-" + strconv.Itoa(os.Getpid())
	_, err := Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportPidfd}})
	require.ErrorIs(t, err, unix.ECONNREFUSED)
	require.ErrorContains(t, err, "fetched the fds, but")
}

// TestLeaseAnswerNeverComes: an exporter's socket that accepts and never
// answers holds a pidfd Open up to its context's deadline, no longer; the
// Open then undoes everything.
func TestLeaseAnswerNeverComes(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	silent := silentListener(t, "@xseg-silent-")
	e := newExporter(t, ExporterOptions{NoSocket: true})
	s := smallShare(t, e, 1)
	d := s.Descriptor()
	d.Endpoint = silent
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := Fetch(ctx, d, FetchOptions{Transports: []Transport{TransportPidfd}})
	took := time.Since(t0)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.GreaterOrEqual(t, took, 150*time.Millisecond)
	require.Less(t, took, 3*time.Second)
}

// TestConcurrentPidfdOpens: Opens of one share from many goroutines at
// once, each through an Importer of its own (so each fetches and leases),
// all succeed with their stages timed, every lease is counted while held,
// and nothing is left.
func TestConcurrentPidfdOpens(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	e, reports := reportingExporter(t)
	imp := backendDriver(t, "host")
	fds := makePages(t, 2, 2<<20)
	s, err := e.ShareFDs(fds, Extent{PageSize: 2 << 20, Spans: []int{1, 1}, Offset: 4096, Length: 4<<20 - 8192}, nil)
	require.NoError(t, err)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	const n = 8
	ms := make([]*Mapping, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ms[i], errs[i] = Open(context.Background(), desc, imp, 0, OpenOptions{})
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.True(t, ms[i].Leased())
		st := ms[i].Stages()
		require.Positive(t, st.Fetch, "%+v", st)
		require.Positive(t, st.Import, "%+v", st)
		require.Positive(t, st.Map, "%+v", st)
		require.GreaterOrEqual(t, st.Reserve, time.Duration(0))
		require.GreaterOrEqual(t, st.Lease, time.Duration(0))
	}
	require.Equal(t, n, s.Leases())
	for _, m := range ms {
		require.NoError(t, m.Close())
	}
	require.Eventually(t, func() bool { return s.Leases() == 0 }, 2*time.Second, time.Millisecond)
	require.Zero(t, imp.Usage().Handles)
	require.NoError(t, s.Close())
	require.Empty(t, reports())
}
