//go:build linux

package ipc

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// keepEnv is an exporter's allocator on one host driver, blocks of it
// shared again and again as torch.multiprocessing shares one tensor after
// another, and an importing host driver.
type keepEnv struct {
	exp vmm.Driver
	a   *expandable.Allocator
	e   *Exporter
	imp vmm.Driver
	// shares are the shares made, for leasesEnd.
	shares []*Share
}

// leasesEnd waits until every importer of every share let go.
func (k *keepEnv) leasesEnd(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, s := range k.shares {
			if s.Leases() != 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "the lease ends at the close")
}

// newKeepEnv makes the importing driver first, so that its leak check
// runs after the exporter's side has closed. The allocator has 2 MiB
// pages, whole pages a block, no chunks: blocks of the test share no
// allocation.
func newKeepEnv(t *testing.T, backend ...string) *keepEnv {
	t.Helper()
	b := "host"
	if len(backend) > 0 {
		b = backend[0]
	}
	imp := backendDriver(t, b)
	exp := backendDriver(t, b)
	cfg := expandable.DefaultConfig()
	cfg.Shareable, cfg.WholePages, cfg.ChunkBytes = true, true, 0
	a, err := expandable.New(exp, 0, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return &keepEnv{exp: exp, a: a, e: newExporter(t, ExporterOptions{}), imp: imp}
}

// share writes seed's pattern over the n bytes at ptr and shares the block
// for one importer, as the torch.multiprocessing reducer does.
func (k *keepEnv) share(t *testing.T, ptr vmm.DevicePtr, n uint64, seed byte) []byte {
	t.Helper()
	require.NoError(t, writePattern(k.exp, ptr, n, seed))
	s, err := k.e.ShareBlock(k.exp, k.a, ptr)
	require.NoError(t, err)
	k.shares = append(k.shares, s)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	require.NoError(t, s.CloseAfter(1, nil))
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	return desc
}

// openRead opens desc through im, checks seed's pattern and closes it,
// returning whether the open took a kept mapping over.
func openRead(t *testing.T, im *Importer, d vmm.Driver, desc []byte, n uint64, seed byte, opts OpenOptions) bool {
	t.Helper()
	m, err := im.Open(context.Background(), desc, 0, opts)
	require.NoError(t, err)
	require.NoError(t, readPattern(d, m.Ptr(), n, seed))
	reused := m.Reused()
	if reused {
		st := m.Stages()
		require.Zero(t, st.Reserve+st.Import+st.Map, "a reused mapping reserves, imports and maps nothing")
	}
	require.NoError(t, m.Close())
	return reused
}

func keepTransports(t *testing.T) map[string]OpenOptions {
	ts := map[string]OpenOptions{"socket": socketOnly}
	if ProbePidfdGetfd() == nil {
		ts["pidfd"] = OpenOptions{Fetch: FetchOptions{Transports: []Transport{TransportPidfd}}}
	}
	return ts
}

// TestKeptMappingServesTheNextShare: the block shared again (new bytes, a
// new share) is opened on the kept mapping, reads the new bytes, and the
// lease of each share is taken and ends; DropKept then gives everything
// back (the importing driver's leak check and the fd count).
func TestKeptMappingServesTheNextShare(t *testing.T) {
	for _, backend := range []string{"host", "cuda"} {
		for name, opts := range keepTransports(t) {
			t.Run(backend+"/"+name, func(t *testing.T) { keptServesNext(t, backend, opts) })
		}
	}
}

func keptServesNext(t *testing.T, backend string, opts OpenOptions) {
	requireNoFDLeak(t)
	k := newKeepEnv(t, backend)
	im, err := NewImporterWith(k.imp, ImporterOptions{KeepFor: time.Hour})
	require.NoError(t, err)
	const n = 3 << 20
	ptr, err := k.a.Alloc(n, 0)
	require.NoError(t, err)
	require.False(t, openRead(t, im, k.imp, k.share(t, ptr, n, 1), n, 1, opts))
	require.Equal(t, 1, im.Kept())
	for seed := byte(2); seed < 6; seed++ {
		k.leasesEnd(t)
		require.True(t, openRead(t, im, k.imp, k.share(t, ptr, n, seed), n, seed, opts), "round %d", seed)
		require.Equal(t, 1, im.Kept())
	}
	require.NoError(t, im.DropKept())
	require.Zero(t, im.Kept())
	require.NoError(t, k.a.Free(ptr))
}

// TestKeptMappingNotTakenForOtherAllocations: a share of other pages, and
// a share of the same address after the exporter released its pages and
// made new ones, get mappings of their own, with their own bytes: only the
// same open files match.
func TestKeptMappingNotTakenForOtherAllocations(t *testing.T) {
	for _, backend := range []string{"host", "cuda"} {
		t.Run(backend, func(t *testing.T) { keptNotTaken(t, backend) })
	}
}

func keptNotTaken(t *testing.T, backend string) {
	requireNoFDLeak(t)
	k := newKeepEnv(t, backend)
	im, err := NewImporterWith(k.imp, ImporterOptions{KeepFor: time.Hour})
	require.NoError(t, err)
	const n = 3 << 20
	p1, err := k.a.Alloc(n, 0)
	require.NoError(t, err)
	p2, err := k.a.Alloc(n, 0)
	require.NoError(t, err)
	require.False(t, openRead(t, im, k.imp, k.share(t, p1, n, 1), n, 1, OpenOptions{}))
	require.False(t, openRead(t, im, k.imp, k.share(t, p2, n, 2), n, 2, OpenOptions{}))
	require.Equal(t, 2, im.Kept())
	k.leasesEnd(t)
	require.NoError(t, k.a.Free(p1))
	require.NoError(t, k.a.Free(p2))
	require.NoError(t, k.a.EmptyCache()) // the pages go back to the driver
	p3, err := k.a.Alloc(n, 0)
	require.NoError(t, err)
	require.False(t, openRead(t, im, k.imp, k.share(t, p3, n, 3), n, 3, OpenOptions{}), "new pages, whatever their address")
	require.Equal(t, 3, im.Kept())
	require.NoError(t, im.DropKept())
	require.NoError(t, k.a.Free(p3))
}

// TestKeptMappingsExpireAndMakeRoom: a kept mapping goes after KeepFor,
// and past KeepMax the oldest goes first.
func TestKeptMappingsExpireAndMakeRoom(t *testing.T) {
	requireNoFDLeak(t)
	k := newKeepEnv(t)
	im, err := NewImporterWith(k.imp, ImporterOptions{KeepFor: 30 * time.Millisecond})
	require.NoError(t, err)
	const n = 1 << 20
	p, err := k.a.Alloc(n, 0)
	require.NoError(t, err)
	openRead(t, im, k.imp, k.share(t, p, n, 1), n, 1, OpenOptions{})
	require.Equal(t, 1, im.Kept())
	require.Eventually(t, func() bool { return im.Kept() == 0 }, 5*time.Second, time.Millisecond)
	require.Zero(t, k.imp.(interface{ Usage() vmm.Usage }).Usage().Mappings, "the expired mapping is unmapped")

	im2, err := NewImporterWith(k.imp, ImporterOptions{KeepFor: time.Hour, KeepMax: 2})
	require.NoError(t, err)
	var ptrs []vmm.DevicePtr
	var descs [][]byte
	for i := range 3 {
		q, err := k.a.Alloc(3<<20, 0) // pages of their own
		require.NoError(t, err)
		ptrs = append(ptrs, q)
		descs = append(descs, k.share(t, q, 3<<20, byte(10+i)))
		openRead(t, im2, k.imp, descs[i], 3<<20, byte(10+i), OpenOptions{})
	}
	require.Equal(t, 2, im2.Kept())
	k.leasesEnd(t)
	// The newest is kept: a new share of its block is served by it.
	require.True(t, openRead(t, im2, k.imp, k.share(t, ptrs[2], 3<<20, 20), 3<<20, 20, OpenOptions{}))
	require.NoError(t, im2.DropKept())
	for _, q := range append(ptrs, p) {
		require.NoError(t, k.a.Free(q))
	}
}

// TestKeptMappingConcurrent: goroutines open and close shares of a few
// blocks while kept mappings expire under them (run with -race); every
// read is right and nothing stays held.
func TestKeptMappingConcurrent(t *testing.T) {
	requireNoFDLeak(t)
	k := newKeepEnv(t)
	im, err := NewImporterWith(k.imp, ImporterOptions{KeepFor: time.Millisecond, KeepMax: 2})
	require.NoError(t, err)
	const n = 1 << 20
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		p, err := k.a.Alloc(n, 0)
		require.NoError(t, err)
		require.NoError(t, writePattern(k.exp, p, n, byte(30+g)))
		s, err := k.e.ShareBlock(k.exp, k.a, p)
		require.NoError(t, err)
		desc, err := s.MarshalBinary()
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				m, err := im.Open(context.Background(), desc, 0, OpenOptions{})
				if err == nil {
					err = errors.Join(readPattern(k.imp, m.Ptr(), n, byte(30+g)), m.Close())
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, im.DropKept())
	require.Zero(t, im.Kept())
}

func TestNewImporterWithRejectsNegative(t *testing.T) {
	d := backendDriver(t, "host")
	_, err := NewImporterWith(d, ImporterOptions{KeepFor: -time.Second})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = NewImporterWith(d, ImporterOptions{KeepMax: -1})
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

// TestKeepFaultMatrix fails every driver operation of the paths kept
// mappings add: dropping them (DropKept, and the oldest pushed out past
// KeepMax) and taking one over, alone and with its undo; a case's Close
// retries DropKept, which must reach nil with nothing held.
func TestKeepFaultMatrix(t *testing.T) {
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	e := newExporter(t, ExporterOptions{})
	var descs [][]byte
	for range 2 {
		ptr, err := a.Alloc(3<<20, 0)
		require.NoError(t, err)
		s, err := e.ShareBlock(exp, a, ptr)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		desc, err := s.MarshalBinary()
		require.NoError(t, err)
		descs = append(descs, desc)
	}
	openClose := func(im *Importer, desc []byte) error {
		m, err := im.Open(context.Background(), desc, 0, OpenOptions{})
		if err != nil {
			return err
		}
		return m.Close()
	}
	setup := func(d vmm.Driver, max int) (*Importer, error) {
		im, err := NewImporterWith(d, ImporterOptions{KeepFor: time.Hour, KeepMax: max})
		if err != nil {
			return nil, err
		}
		return im, openClose(im, descs[0])
	}
	drop := func(im **Importer) func() error {
		return func() error {
			if *im == nil {
				return nil
			}
			return (*im).DropKept()
		}
	}
	scenarios := []vmmtest.Scenario{
		{Name: "keep-drop", Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
			im, err := setup(d, 0)
			return vmmtest.Subject{Act: im.DropKept, Again: func() error { return openClose(im, descs[0]) }, Close: drop(&im)}, err
		}},
		{Name: "keep-push-out", Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
			im, err := setup(d, 1)
			return vmmtest.Subject{Act: func() error { return openClose(im, descs[1]) }, Again: func() error { return openClose(im, descs[0]) }, Close: drop(&im)}, err
		}},
		{Name: "keep-take-over", Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
			im, err := setup(d, 0)
			return vmmtest.Subject{Act: func() error { return openClose(im, descs[0]) }, Again: func() error { return openClose(im, descs[1]) }, Close: drop(&im)}, err
		}},
	}
	n := vmmtest.RunMatrix(t, func() (vmm.Driver, error) { return host.Open(host.Options{}) }, scenarios)
	require.Greater(t, n, 5)
	t.Logf("keep fault matrix: %d cases", n)
}

// TestKeptMappingOutlivesExporter: a mapping kept from another process's
// share stays held after that process exits; an Open of its descriptor
// then fails (nobody serves it) without touching the kept mapping, and
// DropKept gives it back (the driver's leak check at cleanup).
func TestKeptMappingOutlivesExporter(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	d := backendDriver(t, "host")
	const size = 9<<20 + 4096
	c, stdin, desc := startExporterChild(t, "export-alloc", envSize+"="+strconv.Itoa(size), envBackend+"=host")
	im, err := NewImporterWith(d, ImporterOptions{KeepFor: time.Hour})
	require.NoError(t, err)
	m, err := im.Open(context.Background(), desc, 0, OpenOptions{})
	require.NoError(t, err)
	require.NoError(t, readPattern(d, m.Ptr(), size, seedParent))
	require.NoError(t, m.Close())
	require.Equal(t, 1, im.Kept())
	require.NoError(t, stdin.Close())
	require.NoError(t, c.cmd.Wait(), c.errOut.String())
	_, err = im.Open(context.Background(), desc, 0, OpenOptions{})
	require.Error(t, err, "the exporter is gone")
	require.Equal(t, 1, im.Kept())
	require.NoError(t, im.DropKept())
	require.Zero(t, im.Kept())
}
