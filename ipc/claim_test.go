//go:build linux

package ipc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// gatedExporter is an exporter whose accept loop waits at open(): until
// then no request is answered.
func gatedExporter(t *testing.T) (*Exporter, func()) {
	t.Helper()
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	e := newExporter(t, ExporterOptions{refuse: func(*unix.Ucred) bool { <-gate; return false }})
	t.Cleanup(open) // before the exporter's Close (cleanups run last first)
	return e, open
}

// onceShare allocates size bytes with the parent's pattern and shares them
// for one importer.
func onceShare(t *testing.T, e *Exporter, d vmm.Driver, a *expandable.Allocator, size uint64) (*Share, []byte, vmm.DevicePtr) {
	t.Helper()
	ptr, err := a.Alloc(size, 0)
	require.NoError(t, err)
	require.NoError(t, writePattern(d, ptr, size, seedParent))
	s, err := e.ShareBlockOnce(d, a, ptr)
	require.NoError(t, err)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	return s, desc, ptr
}

var pidfdOnly = OpenOptions{Fetch: FetchOptions{Transports: []Transport{TransportPidfd}}}

// claimed is a share for one importer that an Open in this process has
// claimed while the exporter's accept loop waits (until open).
type claimed struct {
	imp, exp vmm.Driver
	a        *expandable.Allocator
	e        *Exporter
	s        *Share
	desc     []byte
	ptr      vmm.DevicePtr
	m        *Mapping
	open     func()
}

// openClaimed shares size bytes for one importer and opens them by pidfd
// with the exporter gated: the Open must claim and return unanswered.
func openClaimed(t *testing.T, size uint64) claimed {
	t.Helper()
	requirePidfd(t)
	c := claimed{imp: backendDriver(t, "host"), exp: backendDriver(t, "host")}
	c.a = shareableAlloc(t, c.exp)
	c.e, c.open = gatedExporter(t)
	c.s, c.desc, c.ptr = onceShare(t, c.e, c.exp, c.a, size)
	var err error
	c.m, err = NewImporter(c.imp).Open(context.Background(), c.desc, 0, pidfdOnly)
	require.NoError(t, err, "no answer is awaited")
	require.True(t, c.m.Claimed())
	return c
}

// TestClaimNeedsNoAnswer: the importer that claims a share made for one
// importer returns from Open while the exporter has answered nothing, and
// reads right; a second importer of the same descriptor (another open in
// the same process) loses the claim, waits, and is refused; the claimant's
// request is served once the exporter runs, and its Close unpins.
func TestClaimNeedsNoAnswer(t *testing.T) {
	c := openClaimed(t, 3<<20)
	imp, a, s, desc, ptr, m, open := c.imp, c.a, c.s, c.desc, c.ptr, c.m, c.open
	require.True(t, m.Leased())
	require.Zero(t, s.Leases(), "the exporter has served nothing yet")
	require.NoError(t, readPattern(imp, m.Ptr(), m.Len(), seedParent))

	second := make(chan error, 1)
	go func() {
		m2, err := NewImporter(imp).Open(context.Background(), desc, 0, OpenOptions{})
		if err == nil {
			err = errors.Join(errors.New("a second importer got the share"), m2.Close())
		}
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("the loser did not wait for the exporter's answer: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	open()
	require.ErrorIs(t, <-second, ErrNotOffered)
	require.Eventually(t, func() bool { return s.Leases() == 1 }, 5*time.Second, time.Millisecond, "the claimant's request is served")
	require.Equal(t, 1, a.Pinned())
	require.NoError(t, a.Free(ptr))
	require.NoError(t, m.Close())
	require.Eventually(t, func() bool { return a.Pinned() == 0 }, 5*time.Second, time.Millisecond)
	require.Zero(t, imp.Usage().Handles)
}

// TestClaimHeldPastClose: the share closes (the exporter's Close) after
// its importer claimed it and before its request is served: the pages
// stay pinned for the claimant, its request is still served, and its
// Close unpins. A share closed before anyone claimed it is the
// exporter's: the importer that fetched it loses the claim and is refused.
func TestClaimHeldPastClose(t *testing.T) {
	c := openClaimed(t, 1<<20)
	imp, exp, a, e, s, ptr, m, open := c.imp, c.exp, c.a, c.e, c.s, c.ptr, c.m, c.open
	require.NoError(t, s.Close())
	require.Equal(t, 1, s.Leases(), "the hold")
	require.NoError(t, a.Free(ptr))
	require.NoError(t, a.EmptyCache())
	require.Equal(t, 1, a.Pinned(), "held for the claimant")
	require.NoError(t, readPattern(imp, m.Ptr(), m.Len(), seedParent))
	open()
	require.Eventually(t, func() bool { return s.holdServed.Load() && e.shareCount() == 0 }, 5*time.Second, time.Millisecond,
		"the claimant's request ends the hold")
	require.Equal(t, 1, a.Pinned(), "the claimant's lease keeps the pages")
	require.NoError(t, m.Close())
	require.Eventually(t, func() bool { return a.Pinned() == 0 }, 5*time.Second, time.Millisecond)

	// Closed before any claim: nothing is held, and a late importer that
	// still fetched the pages loses the claim to the exporter.
	s, desc, ptr := onceShare(t, e, exp, a, 1<<20)
	d, err := handles.ParseDescriptor(desc)
	require.NoError(t, err)
	fds, claim, err := fetchPidfd(d)
	require.NoError(t, err)
	require.NotNil(t, claim)
	require.NoError(t, s.Close())
	require.Zero(t, a.Pinned())
	require.Zero(t, claimShare(claim), "the exporter claimed it as it closed")
	require.NoError(t, errors.Join(claim.Close(), handles.CloseAll(fds)))
	require.NoError(t, a.Free(ptr))
}

// sleeper starts a process that a test can claim a share for and kill.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "60")
	require.NoError(t, c.Start())
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	return c
}

// claimFor claims s for pid as its importer would.
func claimFor(t *testing.T, s *Share, pid int) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	w, err := handles.ClaimFor(s.mu.claim, handles.Claimant{PID: pid, Nonce: 42})
	require.NoError(t, err)
	require.Equal(t, pid, w.PID)
}

// TestClaimHeldUntilClaimantExits: a claimant that never asks (it died
// between its claim and its request) holds a closed share's pages until
// its process is gone, and no longer; the exporter's Close ends a hold
// at once.
func TestClaimHeldUntilClaimantExits(t *testing.T) {
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	e := newExporter(t, ExporterOptions{})
	p := sleeper(t)
	s, _, ptr := onceShare(t, e, exp, a, 1<<20)
	claimFor(t, s, p.Process.Pid)
	require.NoError(t, s.Close())
	require.NoError(t, a.Free(ptr))
	time.Sleep(3 * pollEvery)
	require.Equal(t, 1, a.Pinned(), "held while the claimant lives")
	require.NoError(t, p.Process.Kill())
	_ = p.Wait()
	require.Eventually(t, func() bool { return a.Pinned() == 0 }, 5*time.Second, time.Millisecond, "released once it is gone")
	require.Zero(t, e.shareCount())

	e2, err := NewExporter(ExporterOptions{})
	require.NoError(t, err)
	s, _, ptr = onceShare(t, e2, exp, a, 1<<20)
	claimFor(t, s, sleeper(t).Process.Pid)
	require.NoError(t, s.Close())
	require.Equal(t, 1, a.Pinned())
	require.NoError(t, e2.Close())
	require.Zero(t, a.Pinned(), "the exporter's Close ends every hold")
	require.NoError(t, a.Free(ptr))
}

// TestClaimRace: importers racing for one share made for one importer,
// each through an Importer of its own: exactly one opens it and reads
// right, every other is refused, and nothing is left held.
func TestClaimRace(t *testing.T) {
	requirePidfd(t)
	imp := backendDriver(t, "host")
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	e := newExporter(t, ExporterOptions{})
	for round := range 5 {
		s, desc, ptr := onceShare(t, e, exp, a, 2<<20)
		const n = 6
		maps := make([]*Mapping, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				maps[i], errs[i] = NewImporter(imp).Open(context.Background(), desc, 0, OpenOptions{})
			}()
		}
		wg.Wait()
		won := 0
		for i := range n {
			if errs[i] != nil {
				require.ErrorIs(t, errs[i], ErrRefused, "round %d importer %d", round, i)
				continue
			}
			won++
			require.NoError(t, readPattern(imp, maps[i].Ptr(), maps[i].Len(), seedParent))
			require.NoError(t, maps[i].Close())
		}
		require.Equal(t, 1, won, "round %d", round)
		require.NoError(t, a.Free(ptr))
		require.Eventually(t, func() bool { return a.Pinned() == 0 && s.Leases() == 0 }, 5*time.Second, time.Millisecond)
	}
	require.Zero(t, imp.Usage().Handles)
}

// TestClaimFaults: an importer whose open fails after it claimed (a map
// or access grant fails, and also the undo's unmap) leaves nothing held:
// its request, sent before the failure, is its turn, and the share ends
// with it. A claim memfd another process spoiled (sealed against seals
// but not writes) claims for nobody: the importer waits, is refused, and
// the share's Close unpins.
func TestClaimFaults(t *testing.T) {
	requirePidfd(t)
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	e := newExporter(t, ExporterOptions{OnError: func(error) {}})
	// The allocator's page and its kept export exist before the subtests,
	// whose importer drivers count the fds opened while they run.
	warm, _, wptr := onceShare(t, e, exp, a, 1<<20)
	require.NoError(t, errors.Join(warm.Close(), a.Free(wptr)))
	for _, c := range []struct {
		name string
		arm  func(f *vmmtest.Faulty)
	}{
		{"reserve", func(f *vmmtest.Faulty) { f.FailNth(vmmtest.OpReserve, 1, nil) }},
		{"import", func(f *vmmtest.Faulty) { f.FailNth(vmmtest.OpImportFD, 1, nil) }},
		{"map", func(f *vmmtest.Faulty) { f.FailNth(vmmtest.OpMap, 1, nil) }},
		{"set-access", func(f *vmmtest.Faulty) { f.FailNth(vmmtest.OpSetAccess, 1, nil) }},
		{"set-access-then-unmap", func(f *vmmtest.Faulty) { f.FailNthThen(vmmtest.OpSetAccess, 1, vmmtest.OpUnmap) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			imp := vmmtest.NewFaulty(backendDriver(t, "host"))
			s, desc, ptr := onceShare(t, e, exp, a, 1<<20)
			c.arm(imp)
			_, err := NewImporter(imp).Open(context.Background(), desc, 0, pidfdOnly)
			require.Error(t, err)
			require.NoError(t, a.Free(ptr))
			require.Eventually(t, func() bool { return a.Pinned() == 0 }, 5*time.Second, time.Millisecond,
				"the failed claimant's turn ended the share")
			require.NoError(t, s.Close())
			require.Zero(t, imp.Usage().Handles)
		})
	}

	imp := backendDriver(t, "host")
	s, desc, ptr := onceShare(t, e, exp, a, 1<<20)
	s.mu.RLock()
	_, err := unix.FcntlInt(uintptr(s.mu.claim.Int()), unix.F_ADD_SEALS, unix.F_SEAL_SEAL)
	s.mu.RUnlock()
	require.NoError(t, err)
	_, err = NewImporter(imp).Open(context.Background(), desc, 0, pidfdOnly)
	require.ErrorIs(t, err, ErrRefused)
	require.Equal(t, 1, a.Pinned(), "the share is still open")
	require.NoError(t, s.Close())
	require.Zero(t, a.Pinned())
	require.NoError(t, a.Free(ptr))
	require.Zero(t, imp.Usage().Handles)
}

// shareCount is how many shares the exporter still serves.
func (e *Exporter) shareCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.mu.shares)
}

// TestClaimLeaseRefusals: a claimant's raw request fails cleanly (no fd
// left) when the socket is served by another pid than the descriptor's or
// serves nothing; the caller then asks the usual way.
func TestClaimLeaseRefusals(t *testing.T) {
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	d := &handles.Descriptor{ExporterPID: unix.Getpid() + 1, Endpoint: e.Endpoint()}
	_, err := claimLease(d, 7)
	require.ErrorIs(t, err, ErrRefused, "served by this pid, not the descriptor's")
	d = &handles.Descriptor{ExporterPID: unix.Getpid(), Endpoint: "@xseg-nobody-serves-this"}
	_, err = claimLease(d, 7)
	require.ErrorIs(t, err, unix.ECONNREFUSED)
	_, err = claimLease(&handles.Descriptor{ExporterPID: unix.Getpid()}, 7)
	require.ErrorIs(t, err, vmm.ErrNotSupported, "no socket")
}

// TestClaimHoldEndsWithTheRequest: a share closed while held for its
// claimant is unpinned once the claimant, served afterwards, closes its
// mapping, without waiting for the hold's watcher (made to look only
// every 3 s here, which the exporter's Close then waits out): the request that ends the hold drops the hold's
// lease, and the claimant's close returns after its own lease is gone.
func TestClaimHoldEndsWithTheRequest(t *testing.T) {
	requirePidfd(t)
	imp, exp := backendDriver(t, "host"), backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	e := newExporter(t, ExporterOptions{holdPoll: 3 * time.Second, refuse: func(*unix.Ucred) bool { <-gate; return false }})
	t.Cleanup(open)
	s, desc, ptr := onceShare(t, e, exp, a, 1<<20)
	opts := OpenOptions{Fetch: FetchOptions{Transports: []Transport{TransportPidfd}, LeaseAckWait: time.Minute}}
	m, err := NewImporter(imp).Open(context.Background(), desc, 0, opts)
	require.NoError(t, err)
	require.True(t, m.Claimed())
	require.NoError(t, s.Close())
	require.Equal(t, 1, s.Leases(), "the hold")
	require.NoError(t, a.Free(ptr))
	open()
	require.Eventually(t, func() bool { return s.holdServed.Load() && s.Leases() == 1 && s.holdDropped.Load() },
		1500*time.Millisecond, time.Millisecond, "the request drops the hold's lease, before the watcher looks; the claimant's remains")
	require.Equal(t, 1, a.Pinned(), "the claimant's lease keeps the pages")
	require.NoError(t, m.Close())
	require.Zero(t, a.Pinned(), "unpinned when the claimant's close returns, not at the watcher's next look")
	require.Zero(t, s.Leases())
}

// TestClaimClosedUnheld: a request that reaches a share made for one
// importer after it closed, held for nobody, is left to send's closed
// check ("share closed", ErrRefused), not refused as held for another.
func TestClaimClosedUnheld(t *testing.T) {
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	e := newExporter(t, ExporterOptions{})
	s, _, ptr := onceShare(t, e, exp, a, 1<<20)
	require.NoError(t, s.Close())
	nonce, err := handles.NewNonce()
	require.NoError(t, err)
	s.mu.RLock()
	require.Zero(t, s.mu.heldFor.PID, "nobody claimed it: not held")
	require.NoError(t, s.claimedBy(requestMsg{flags: flagClaim, nonce: nonce}, os.Getpid()))
	s.mu.RUnlock()
	require.NoError(t, a.Free(ptr))
}
