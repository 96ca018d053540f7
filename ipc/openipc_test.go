//go:build linux

package ipc

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// fakeIPC is a host driver with CUDA's legacy IPC faked inside one
// process: a handle names an allocation by its address, an open returns
// that address, and, as CUDA, a handle cannot be open twice at once.
type fakeIPC struct {
	vmm.Driver
	short uint64 // if set, opens report this size
	mu    sync.Mutex
	sizes map[vmm.DevicePtr]uint64
	open  map[vmm.DevicePtr]bool
	opens int
	close int
}

func (f *fakeIPC) ExportAllocIPC(ptr vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var h vmm.IPCMemHandle
	binary.LittleEndian.PutUint64(h[:], uint64(ptr))
	h[63] = 0xcd
	f.sizes[ptr] = fbSeg
	return h, nil
}

func (f *fakeIPC) OpenAllocIPC(h vmm.IPCMemHandle, _ vmm.Device) (vmm.DevicePtr, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := vmm.DevicePtr(binary.LittleEndian.Uint64(h[:]))
	if f.open[p] {
		return 0, 0, fmt.Errorf("handle of %v already open: %w", p, vmm.ErrInUse)
	}
	f.open[p] = true
	f.opens++
	if f.short != 0 {
		return p, f.short, nil
	}
	return p, f.sizes[p], nil
}

func (f *fakeIPC) CloseAllocIPC(p vmm.DevicePtr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.open[p] {
		return fmt.Errorf("%v not open: %w", p, vmm.ErrInvalid)
	}
	delete(f.open, p)
	f.close++
	return nil
}

func (f *fakeIPC) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opens, f.close
}

// foreign rewrites a share's descriptor as if another process (our
// parent) had exported it without a socket.
func foreign(t *testing.T, s *Share) []byte {
	t.Helper()
	d := s.Descriptor()
	d.ExporterPID, d.Endpoint = os.Getppid(), ""
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	return b
}

// TestCUDAIPCOpensOncePerHandle: two blocks of one segment shared as two
// cuda-ipc descriptors open the allocation once in the Importer (whose
// driver here is of a type a registry keyed by drivers could not hold),
// and close it after the last mapping; another importer opens the handle
// itself (which CUDA, as the fake, refuses while the first holds it); the
// exporting process is refused.
func TestCUDAIPCOpensOncePerHandle(t *testing.T) {
	requireNoFDLeak(t)
	f := &fakeIPC{Driver: backendDriver(t, "host"), sizes: map[vmm.DevicePtr]uint64{}, open: map[vmm.DevicePtr]bool{}}
	a := fallbackAlloc(t, f)
	p1, err := a.Alloc(fbPre, 0)
	require.NoError(t, err)
	p2, err := a.Alloc(fbShare, 0)
	require.NoError(t, err)
	e := newExporter(t, ExporterOptions{NoSocket: true})
	s1, err := e.ShareBlock(f, a, p1)
	require.NoError(t, err)
	s2, err := e.ShareBlock(f, a, p2)
	require.NoError(t, err)
	require.Equal(t, handles.KindCUDAIPC, s1.Descriptor().Kind)
	require.Equal(t, s1.Descriptor().IPC, s2.Descriptor().IPC, "one allocation, one handle")

	own, err := s1.MarshalBinary()
	require.NoError(t, err)
	im := NewImporter(newUncomparableIPC(f))
	_, err = im.Open(context.Background(), own, 0, OpenOptions{})
	require.ErrorIs(t, err, ErrOwnIPCHandle)
	require.Equal(t, 0, f.opens, "refused before the driver is asked")

	ctx := context.Background()
	m1, err := im.Open(ctx, foreign(t, s1), 0, OpenOptions{})
	require.NoError(t, err)
	require.Equal(t, TransportCUDAIPC, m1.Via())
	require.False(t, m1.Leased(), "no socket, no lease")
	m2, err := im.Open(ctx, foreign(t, s2), 0, OpenOptions{})
	require.NoError(t, err)
	require.Equal(t, p1, m1.Ptr())
	require.Equal(t, p2, m2.Ptr(), "the block sits at its offset in the opened allocation")
	opens, _ := f.counts()
	require.Equal(t, 1, opens, "one open per handle in the importer")
	_, err = NewImporter(f).Open(ctx, foreign(t, s2), 0, OpenOptions{})
	require.ErrorIs(t, err, vmm.ErrInUse, "another importer opens the handle itself")
	require.NoError(t, m1.Close())
	_, closes := f.counts()
	require.Zero(t, closes, "the other mapping still uses the allocation")
	require.NoError(t, m2.Close())
	opens, closes = f.counts()
	require.Equal(t, 1, closes)
	require.Empty(t, im.opens)

	f.short = fbPre + 4096 // the block at 3 MiB does not fit
	_, err = im.Open(ctx, foreign(t, s2), 0, OpenOptions{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "the block ends at byte")
	opens2, closes2 := f.counts()
	require.Equal(t, opens+1, opens2)
	require.Equal(t, opens2, closes2, "a failed Open closes what it opened")

	require.NoError(t, s1.Close())
	require.NoError(t, s2.Close())
	require.Zero(t, a.Pinned())
	require.NoError(t, a.Free(p1))
	require.NoError(t, a.Free(p2))
}

// TestOpenRejectsMalformedCUDAIPC: Open refuses malformed cuda-ipc
// descriptors before any transport or driver is involved.
func TestOpenRejectsMalformedCUDAIPC(t *testing.T) {
	d := backendDriver(t, "host")
	good := handles.Descriptor{Kind: handles.KindCUDAIPC, ExporterPID: os.Getppid(), PageSize: fbSeg, PageCount: 1,
		Offset: fbPre, Length: fbShare, Token: handles.Token{1}, IPC: handles.IPCHandle{2}}
	b, err := good.MarshalBinary()
	require.NoError(t, err)
	for name, c := range map[string]struct {
		edit func([]byte) []byte
		says string
	}{
		"two pages":  {func(b []byte) []byte { binary.LittleEndian.PutUint32(b[36:], 2); return b }, "one allocation, one page"},
		"no handle":  {func(b []byte) []byte { binary.LittleEndian.PutUint32(b[74:], 0); return b[:78] }, "0 handles in a cuda-ipc descriptor"},
		"truncated":  {func(b []byte) []byte { return b[:len(b)-1] }, "truncated"},
		"zero bytes": {func(b []byte) []byte { clear(b[78:]); return b }, "0 handles in a cuda-ipc descriptor"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Open(context.Background(), c.edit(append([]byte(nil), b...)), d, 0, OpenOptions{})
			require.ErrorIs(t, err, vmm.ErrInvalid)
			require.ErrorContains(t, err, c.says)
		})
	}
}

// TestShareAllocFaults: a failed export of a fallback segment unpins the
// block and leaves nothing behind; a driver error other than "not
// supported" from ExportAllocIPC is not papered over by the fd path.
func TestShareAllocFaults(t *testing.T) {
	requireNoFDLeak(t)
	f := vmmtest.NewFaulty(backendDriver(t, "host"))
	a := fallbackAlloc(t, f)
	p, err := a.Alloc(fbShare, 0)
	require.NoError(t, err)
	e := newExporter(t, ExporterOptions{})

	f.FailNth(vmmtest.OpExportAllocFD, 1, nil)
	_, err = e.ShareBlock(f, a, p)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.ErrorContains(t, err, "no CUDA IPC")
	require.Zero(t, a.Pinned(), "a failed share unpins")

	f.FailNth(vmmtest.OpExportAllocIPC, 1, nil)
	_, err = e.ShareBlock(f, a, p)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.Zero(t, f.Calls(vmmtest.OpExportAllocFD)-1, "the fd path is not tried after a real IPC error")
	require.Zero(t, a.Pinned())

	s, err := e.ShareBlock(f, a, p)
	require.NoError(t, err, "the next share works")
	require.Equal(t, handles.KindPosixFD, s.Descriptor().Kind)
	require.NoError(t, s.Close())
	require.Zero(t, a.Pinned())
	require.NoError(t, a.Free(p))
}
