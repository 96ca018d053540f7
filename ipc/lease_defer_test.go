//go:build linux

package ipc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestOpenLeaseRefusedAfterMapping: an Open that fetched by pidfd maps the
// pages while its lease request is answered; a refusal then undoes the
// mapping (nothing held, no fd left) and Open fails with ErrRefused. An
// Open the socket admits holds its lease when it returns.
func TestOpenLeaseRefusedAfterMapping(t *testing.T) {
	requirePidfd(t)
	// The importer's driver first: its fd check runs after the
	// exporter's allocator has closed (with its kept exports).
	imp := vmmtest.NewFaulty(backendDriver(t, "host"))
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	ptr, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	base := vmmtest.TakeBaseline()
	e := newExporter(t, ExporterOptions{refuse: func(*unix.Ucred) bool { return true }})
	s, err := e.ShareBlock(exp, a, ptr)
	require.NoError(t, err)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	_, err = Open(context.Background(), desc, imp, 0, OpenOptions{Fetch: FetchOptions{Transports: []Transport{TransportPidfd}}})
	require.ErrorIs(t, err, ErrRefused)
	require.Positive(t, imp.Calls(vmmtest.OpMap), "the pages were mapped before the answer came")
	require.Zero(t, imp.Usage().Handles, "and undone")
	require.NoError(t, s.Close())
	require.NoError(t, e.Close())
	require.NoError(t, a.Free(ptr))
	require.NoError(t, a.EmptyCache(), "releasing the page closes its kept export")
	require.Empty(t, base.Leaks(imp))
	ptr, err = a.Alloc(1<<20, 0)
	require.NoError(t, err)

	e = newExporter(t, ExporterOptions{})
	s, err = e.ShareBlock(exp, a, ptr)
	require.NoError(t, err)
	desc, err = s.MarshalBinary()
	require.NoError(t, err)
	m, err := Open(context.Background(), desc, imp, 0, OpenOptions{Fetch: FetchOptions{Transports: []Transport{TransportPidfd}}})
	require.NoError(t, err)
	require.True(t, m.Leased())
	require.Equal(t, TransportPidfd, m.Via())
	require.Equal(t, 1, s.Leases())
	require.NoError(t, m.Close())
	require.NoError(t, s.Close())
	require.NoError(t, a.Free(ptr))
}

// TestOpenDeferLease: with OpenOptions.DeferLease, Open returns the
// mapping before the exporter's answer; AwaitLease reads it. A refusal
// comes from AwaitLease (every call), an Open of the same descriptor
// without DeferLease then fails too, and Close gives everything back. An
// admitted lease is held once AwaitLease returns nil, and a kept mapping
// taken over is deferred the same way.
func TestOpenDeferLease(t *testing.T) {
	requirePidfd(t)
	imp := vmmtest.NewFaulty(backendDriver(t, "host"))
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	ptr, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, writePattern(exp, ptr, 1<<20, seedParent))
	base := vmmtest.TakeBaseline()
	pidfd := OpenOptions{Fetch: FetchOptions{Transports: []Transport{TransportPidfd}}, DeferLease: true}

	e := newExporter(t, ExporterOptions{refuse: func(*unix.Ucred) bool { return true }})
	s, err := e.ShareBlock(exp, a, ptr)
	require.NoError(t, err)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	im := NewImporter(imp)
	m, err := im.Open(context.Background(), desc, 0, pidfd)
	require.NoError(t, err, "the answer is not read yet")
	require.ErrorIs(t, m.AwaitLease(), ErrRefused)
	require.ErrorIs(t, m.AwaitLease(), ErrRefused, "every call")
	waited := pidfd
	waited.DeferLease = false
	_, err = im.Open(context.Background(), desc, 0, waited)
	require.ErrorIs(t, err, ErrRefused, "an Open that waits shares the refused mapping's answer")
	require.NoError(t, m.Close())
	require.Zero(t, imp.Usage().Handles)
	require.NoError(t, s.Close())
	require.NoError(t, e.Close())

	e = newExporter(t, ExporterOptions{})
	im, err = NewImporterWith(imp, ImporterOptions{KeepFor: time.Hour})
	require.NoError(t, err)
	for round := range 2 {
		s, err = e.ShareBlock(exp, a, ptr)
		require.NoError(t, err)
		desc, err = s.MarshalBinary()
		require.NoError(t, err)
		m, err = im.Open(context.Background(), desc, 0, pidfd)
		require.NoError(t, err)
		require.Equal(t, round == 1, m.Reused())
		require.NoError(t, m.AwaitLease())
		require.True(t, m.Leased())
		require.Equal(t, 1, s.Leases())
		require.NoError(t, readPattern(imp, m.Ptr(), m.Len(), seedParent))
		require.NoError(t, m.Close())
		require.NoError(t, s.Close())
		require.Eventually(t, func() bool { return s.Leases() == 0 }, 5*time.Second, time.Millisecond)
	}
	require.NoError(t, im.DropKept())
	require.NoError(t, e.Close())
	require.NoError(t, a.Free(ptr))
	require.NoError(t, a.EmptyCache())
	require.Empty(t, base.Leaks(imp))
}

// TestAwaitLeaseConcurrentAndAfterClose: Leased and Stages may be read
// while another goroutine awaits the deferred lease (the race detector
// watches), and awaiting the lease of a mapping torn down before anyone
// awaited it is ErrClosed, not a crash.
func TestAwaitLeaseConcurrentAndAfterClose(t *testing.T) {
	requirePidfd(t)
	imp, exp := backendDriver(t, "host"), backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	e := newExporter(t, ExporterOptions{})
	deferred := OpenOptions{DeferLease: true, Fetch: FetchOptions{Transports: []Transport{TransportPidfd}}}
	for _, await := range []bool{true, false} {
		ptr, err := a.Alloc(1<<20, 0)
		require.NoError(t, err)
		s, err := e.ShareBlock(exp, a, ptr)
		require.NoError(t, err)
		desc, err := s.MarshalBinary()
		require.NoError(t, err)
		m, err := Open(context.Background(), desc, imp, 0, deferred)
		require.NoError(t, err)
		if await {
			done := make(chan struct{})
			go func() {
				defer close(done)
				for range 100 {
					_, _ = m.Leased(), m.Stages()
				}
			}()
			require.NoError(t, m.AwaitLease())
			<-done
			require.True(t, m.Leased())
			require.NoError(t, m.Close())
			require.NoError(t, m.AwaitLease(), "awaited before: its outcome stays")
		} else {
			require.NoError(t, m.Close())
			require.ErrorIs(t, m.AwaitLease(), vmm.ErrClosed)
		}
		require.NoError(t, s.Close())
		require.NoError(t, a.Free(ptr))
	}
}
