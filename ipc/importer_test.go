//go:build linux

package ipc

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// socketOnly fetches by socket: it works without pidfd_getfd.
var socketOnly = OpenOptions{Fetch: FetchOptions{Transports: []Transport{TransportSocket}}}

// importEnv is a 1 MiB block shared from one host driver, to be opened
// on another.
type importEnv struct {
	imp  vmm.Driver
	s    *Share
	desc []byte
}

func newImportEnv(t *testing.T) *importEnv {
	t.Helper()
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	ptr, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, writePattern(exp, ptr, 1<<20, seedParent))
	e := newExporter(t, ExporterOptions{})
	s, err := e.ShareBlock(exp, a, ptr)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	return &importEnv{imp: backendDriver(t, "host"), s: s, desc: desc}
}

// leasesEnd waits until the exporter has seen every lease end: its end
// of each connection is closed by then.
func (e *importEnv) leasesEnd(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return e.s.Leases() == 0 }, 5*time.Second, time.Millisecond)
}

// uncomparable is a driver whose dynamic type cannot be compared: a
// registry keyed by driver values could not hold it (the one Open kept
// before the Importer gave such drivers no sharing at all).
type uncomparable struct {
	vmm.Driver
	_ []byte
}

// uncomparableIPC is uncomparable over a driver with CUDA IPC of plain
// allocations, which it keeps (an embedded vmm.Driver alone would hide it).
type uncomparableIPC struct {
	uncomparable
	vmm.AllocIPC
}

func newUncomparableIPC(f *fakeIPC) uncomparableIPC {
	return uncomparableIPC{uncomparable{Driver: f}, f}
}

// TestImporterSharesWhatOpensThroughIt: Opens of one descriptor through
// one Importer share one mapping, whatever the driver's type; two
// Importers on one driver share nothing.
func TestImporterSharesWhatOpensThroughIt(t *testing.T) {
	requireNoFDLeak(t)
	e := newImportEnv(t)
	ctx := context.Background()
	im := NewImporter(uncomparable{Driver: e.imp})
	m1, err := im.Open(ctx, e.desc, 0, socketOnly)
	require.NoError(t, err)
	m2, err := im.Open(ctx, e.desc, 0, socketOnly)
	require.NoError(t, err)
	require.Equal(t, m1.Ptr(), m2.Ptr(), "one mapping")
	require.Equal(t, 1, e.imp.Usage().Ranges)

	other := NewImporter(e.imp)
	m3, err := other.Open(ctx, e.desc, 0, socketOnly)
	require.NoError(t, err)
	require.NotEqual(t, m1.Ptr(), m3.Ptr(), "another importer maps the block itself")
	require.Equal(t, 2, e.imp.Usage().Ranges)
	m4, err := Open(ctx, e.desc, e.imp, 0, socketOnly)
	require.NoError(t, err)
	require.NotEqual(t, m3.Ptr(), m4.Ptr(), "Open uses an importer of its own")
	require.Equal(t, 3, e.imp.Usage().Ranges)
	require.NoError(t, readPattern(e.imp, m4.Ptr(), m4.Len(), seedParent))

	for _, m := range []*Mapping{m1, m3, m4} {
		require.NoError(t, m.Close())
	}
	require.NoError(t, readPattern(e.imp, m2.Ptr(), m2.Len(), seedParent), "m2 still holds the shared mapping")
	require.NoError(t, m2.Close())
	require.True(t, e.imp.Usage().Zero(), "%v", e.imp.Usage())
	require.Empty(t, im.maps, "the importer forgets closed mappings")
	require.Empty(t, other.maps)
	e.leasesEnd(t)
}

// TestImporterConcurrentOpens: concurrent Opens of one descriptor through
// one Importer wait for one mapping, and the last Close gives it back.
func TestImporterConcurrentOpens(t *testing.T) {
	requireNoFDLeak(t)
	e := newImportEnv(t)
	im := NewImporter(e.imp)
	const n = 8
	ms := make([]*Mapping, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ms[i], errs[i] = im.Open(context.Background(), e.desc, 0, socketOnly) })
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, ms[0].Ptr(), ms[i].Ptr())
	}
	require.Equal(t, 1, e.imp.Usage().Ranges, "one mapping")
	require.Equal(t, n, im.maps[ms[0].m.key].refs)
	for _, m := range ms {
		wg.Go(func() { require.NoError(t, m.Close()) })
	}
	wg.Wait()
	require.True(t, e.imp.Usage().Zero(), "%v", e.imp.Usage())
	require.Empty(t, im.maps)
	e.leasesEnd(t)
}

// TestImporterForgetsFailedOpen: an Open that fails leaves nothing in the
// importer, and the next Open of the descriptor makes a mapping.
func TestImporterForgetsFailedOpen(t *testing.T) {
	requireNoFDLeak(t)
	e := newImportEnv(t)
	f := vmmtest.NewFaulty(e.imp)
	im := NewImporter(f)
	f.FailNth(vmmtest.OpMap, 1, nil)
	_, err := im.Open(context.Background(), e.desc, 0, socketOnly)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.Empty(t, im.maps)
	require.True(t, e.imp.Usage().Zero(), "a failed Open undoes everything: %v", e.imp.Usage())
	m, err := im.Open(context.Background(), e.desc, 0, socketOnly)
	require.NoError(t, err)
	require.NoError(t, readPattern(e.imp, m.Ptr(), m.Len(), seedParent))
	require.NoError(t, m.Close())
	require.True(t, e.imp.Usage().Zero(), "%v", e.imp.Usage())
	e.leasesEnd(t)
}

// TestImporterSharesOnlyLikeAccess: Opens of one descriptor through one
// Importer share a mapping only when they ask for the same access. A
// read-only Open after a read-write one must not get a writable mapping,
// nor a read-write Open after a read-only one a mapping it cannot write.
func TestImporterSharesOnlyLikeAccess(t *testing.T) {
	requireNoFDLeak(t)
	e := newImportEnv(t)
	ctx := context.Background()
	im := NewImporter(e.imp)
	readOnly := socketOnly
	readOnly.Access = vmm.AccessRead

	rw, err := im.Open(ctx, e.desc, 0, socketOnly)
	require.NoError(t, err)
	ro, err := im.Open(ctx, e.desc, 0, readOnly)
	require.NoError(t, err)
	require.NotEqual(t, rw.Ptr(), ro.Ptr(), "a read-only Open maps the block itself")
	require.ErrorIs(t, e.imp.CopyHtoD(ro.Ptr(), []byte{1}), vmm.ErrInvalid, "the read-only Open cannot write")
	require.NoError(t, readPattern(e.imp, ro.Ptr(), ro.Len(), seedParent))
	// Default access (zero) is read-write: it shares rw's mapping.
	rw2, err := im.Open(ctx, e.desc, 0, OpenOptions{Fetch: socketOnly.Fetch, Access: vmm.AccessReadWrite})
	require.NoError(t, err)
	require.Equal(t, rw.Ptr(), rw2.Ptr())
	ro2, err := im.Open(ctx, e.desc, 0, readOnly)
	require.NoError(t, err)
	require.Equal(t, ro.Ptr(), ro2.Ptr())
	require.Equal(t, 2, e.imp.Usage().Ranges)
	for _, m := range []*Mapping{rw, ro, rw2, ro2} {
		require.NoError(t, m.Close())
	}

	// The other order: read-only first, then read-write.
	ro, err = im.Open(ctx, e.desc, 0, readOnly)
	require.NoError(t, err)
	rw, err = im.Open(ctx, e.desc, 0, socketOnly)
	require.NoError(t, err)
	require.NoError(t, e.imp.CopyHtoD(rw.Ptr(), []byte{seedParent}), "a read-write Open can write")
	require.NoError(t, rw.Close())
	require.NoError(t, ro.Close())
	require.True(t, e.imp.Usage().Zero(), "%v", e.imp.Usage())
	require.Empty(t, im.maps)
	e.leasesEnd(t)
}
