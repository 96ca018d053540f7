//go:build linux

package ipc

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// A share for a known number of importers closes itself after the last of
// them took its lease, runs done once, and releases only when every lease
// has ended.
func TestCloseAfterImporters(t *testing.T) {
	for _, tr := range []Transport{TransportSocket, TransportPidfd} {
		t.Run(tr.String(), func(t *testing.T) {
			if tr == TransportPidfd {
				requirePidfd(t)
			}
			requireNoFDLeak(t)
			e := newExporter(t, ExporterOptions{})
			var released, done atomic.Int32
			s, err := e.ShareFDs(makePages(t, 2, 4096), Extent{PageSize: 4096, Length: 8192}, func() error {
				released.Add(1)
				return nil
			})
			require.NoError(t, err)
			require.NoError(t, s.CloseAfter(2, func() { done.Add(1) }))
			opts := FetchOptions{Transports: []Transport{tr}}
			r1, err := Fetch(context.Background(), s.Descriptor(), opts)
			require.NoError(t, err)
			require.Zero(t, done.Load(), "one importer of two")
			r2, err := Fetch(context.Background(), s.Descriptor(), opts)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return done.Load() == 1 }, 5*time.Second, time.Millisecond)
			_, err = Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
			require.ErrorIs(t, err, ErrRefused, "a third importer is refused")
			require.Zero(t, released.Load(), "importers hold leases")
			require.NoError(t, r1.Close())
			require.NoError(t, r2.Close())
			require.Eventually(t, func() bool { return released.Load() == 1 }, 5*time.Second, time.Millisecond)
			require.NoError(t, s.Close(), "closing again is a no-op")
			require.Equal(t, int32(1), done.Load())
			require.Equal(t, int32(1), released.Load())
		})
	}
}

// Importers racing for a share of one: exactly one gets it.
func TestCloseAfterOneRace(t *testing.T) {
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	s := smallShare(t, e, 1)
	require.NoError(t, s.CloseAfter(1, nil))
	var wg sync.WaitGroup
	var got atomic.Int32
	var rs sync.Map
	for i := range 8 {
		wg.Go(func() {
			r, err := Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
			if err == nil {
				got.Add(1)
				rs.Store(i, r)
				return
			}
			require.ErrorIs(t, err, ErrRefused)
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), got.Load())
	rs.Range(func(_, v any) bool { require.NoError(t, v.(*Received).Close()); return true })
}

func TestCloseAfterBadInput(t *testing.T) {
	e := newExporter(t, ExporterOptions{})
	s := smallShare(t, e, 1)
	for _, n := range []int{0, -1, 1 << 31} {
		require.ErrorIs(t, s.CloseAfter(n, nil), vmm.ErrInvalid, "n=%d", n)
	}
	// A limit already met closes at once.
	r, err := Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
	require.NoError(t, err)
	var done atomic.Bool
	require.NoError(t, s.CloseAfter(1, func() { done.Store(true) }))
	require.True(t, done.Load())
	_, err = Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
	require.ErrorIs(t, err, ErrRefused)
	require.NoError(t, r.Close())
}
