package main

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestRun runs the program on the host backend: the memory goes back to
// the device while idle and the weights come back intact.
func TestRun(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	var out bytes.Buffer
	require.NoError(t, run(&out, xseg.Options{Driver: d}, 20*time.Millisecond), out.String())
	require.Equal(t, ""+
		"after 101 requests:    reserved  192 MiB, device free 832 MiB, paused false (0 pauses, 0 resumes)\n"+
		"idle:                  reserved    0 MiB, device free 1024 MiB, paused true (1 pauses, 0 resumes)\n"+
		"after one more:        reserved  192 MiB, device free 832 MiB, paused false (1 pauses, 1 resumes)\n"+
		"weight 12345: 43 before the pause, 43 after (want 43), at the same address; weights remapped 1 time(s)\n",
		out.String())
}

// TestServiceUnderLoad: requests from many goroutines while the service
// pauses whenever it is idle for a millisecond all read the weights
// intact (run with -race).
func TestServiceUnderLoad(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Driver: d, Config: &cfg})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	s, err := newService(a, 4<<20, 8<<20, time.Millisecond)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range uint64(4) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range uint64(50) {
				q := (g*7919 + i*104729) % (4 << 20)
				b, err := s.Query(q)
				if err != nil || b != weightByte(q) {
					t.Errorf("query %d: %d, %v; want %d", q, b, err, weightByte(q))
					return
				}
				if i%10 == 0 {
					time.Sleep(3 * time.Millisecond) // long enough to pause
				}
			}
		}()
	}
	wg.Wait()
	_, sleeps, wakes := s.Sleeping()
	require.NotZero(t, sleeps, "the service paused under a bursty load")
	require.GreaterOrEqual(t, sleeps, wakes)
	require.NoError(t, s.Close())
}

// TestPauseFailureKeepsServing: on an allocator that cannot pause (the
// fallback allocator: plain allocations cannot come back at their
// addresses) the service stays awake and answers every request, and the
// program says why it could not pause. Before, a failed pause marked the
// service paused anyway, and every later request failed trying to resume.
func TestPauseFailureKeepsServing(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Driver: d, Allocator: xseg.AllocatorFallback, Config: &cfg})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	s, err := newService(a, 4<<20, 8<<20, time.Millisecond)
	require.NoError(t, err)
	for i := range uint64(5) {
		time.Sleep(20 * time.Millisecond) // idle: the service tries to pause
		q := i * 7919
		b, err := s.Query(q)
		require.NoError(t, err, "query %d after a failed pause", q)
		require.Equal(t, weightByte(q), b)
		paused, sleeps, wakes := s.Sleeping()
		require.False(t, paused)
		require.Zero(t, sleeps+wakes)
	}
	require.ErrorIs(t, s.Close(), vmm.ErrNotSupported, "Close reports the failed pause")

	var out bytes.Buffer
	err = run(&out, xseg.Options{Driver: d, Allocator: xseg.AllocatorFallback}, time.Millisecond)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.Contains(t, err.Error(), "the service could not pause")
}
