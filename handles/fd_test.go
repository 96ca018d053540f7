//go:build linux

package handles

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

// openFDs counts the descriptors open in this process.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

func isOpen(raw int) bool {
	_, err := unix.FcntlInt(uintptr(raw), unix.F_GETFD, 0)
	return err == nil
}

func newMemfd(t *testing.T) *FD {
	t.Helper()
	raw, err := unix.MemfdCreate("handles-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	fd, err := NewFD(raw)
	require.NoError(t, err)
	return fd
}

func TestFDCloseIdempotent(t *testing.T) {
	before := openFDs(t)
	fd := newMemfd(t)
	raw := fd.Int()
	require.GreaterOrEqual(t, raw, 0)
	require.True(t, isOpen(raw))
	require.NoError(t, fd.Close())
	require.False(t, isOpen(raw))
	require.Equal(t, -1, fd.Int())
	require.NoError(t, fd.Close())
	require.Equal(t, before, openFDs(t))
}

func TestFDDupIsIndependent(t *testing.T) {
	before := openFDs(t)
	fd := newMemfd(t)
	require.NoError(t, unix.Ftruncate(fd.Int(), 8192))
	dup, err := fd.Dup()
	require.NoError(t, err)
	require.NotEqual(t, fd.Int(), dup.Int())
	flags, err := unix.FcntlInt(uintptr(dup.Int()), unix.F_GETFD, 0)
	require.NoError(t, err)
	require.NotZero(t, flags&unix.FD_CLOEXEC, "dup must be close-on-exec")

	require.NoError(t, fd.Close())
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(dup.Int(), &st), "dup outlives the original")
	require.EqualValues(t, 8192, st.Size)
	require.NoError(t, dup.Close())

	_, err = fd.Dup()
	require.ErrorIs(t, err, vmm.ErrClosed)
	require.Equal(t, before, openFDs(t))
}

func TestFDDisownMovesOwnership(t *testing.T) {
	fd := newMemfd(t)
	raw := fd.Disown()
	require.GreaterOrEqual(t, raw, 0)
	require.Equal(t, -1, fd.Disown())
	require.NoError(t, fd.Close())
	require.True(t, isOpen(raw), "Close after Disown must not close the disowned fd")
	fd = nil
	runtime.GC()
	runtime.GC()
	require.True(t, isOpen(raw), "the cleanup must not close a disowned fd")
	require.NoError(t, unix.Close(raw))
}

func TestFDCleanupClosesLeaked(t *testing.T) {
	raw := func() int {
		fd := newMemfd(t)
		return fd.Int()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for isOpen(raw) && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	require.False(t, isOpen(raw), "leaked FD not closed by its cleanup")
}

func TestNewFDRejectsNegative(t *testing.T) {
	_, err := NewFD(-1)
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

func TestCloseAllSkipsNil(t *testing.T) {
	before := openFDs(t)
	a, b := newMemfd(t), newMemfd(t)
	require.NoError(t, CloseAll([]*FD{a, nil, b}))
	require.Equal(t, -1, a.Int())
	require.Equal(t, -1, b.Int())
	require.Equal(t, before, openFDs(t))
}

func TestFabricConversions(t *testing.T) {
	var h vmm.FabricHandle
	h[0], h[63] = 0xab, 1
	f := FabricOf(h)
	require.False(t, f.IsZero())
	require.True(t, Fabric{}.IsZero())
	require.Equal(t, h, f.Driver())
	require.Equal(t, "fabric:ab000000…", f.String())
}

// TestSameOpenFile: a dup is the same open file, another memfd is not
// (even one of the same name), and a closed FD is an error.
func TestSameOpenFile(t *testing.T) {
	a, b := newMemfd(t), newMemfd(t)
	d, err := a.Dup()
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	same, err := SameOpenFile(a, a)
	if errors.Is(err, vmm.ErrNotSupported) {
		t.Skipf("kcmp not allowed here: %v", err)
	}
	require.NoError(t, err)
	require.True(t, same)
	same, err = SameOpenFile(a, d)
	require.NoError(t, err)
	require.True(t, same, "a dup")
	same, err = SameOpenFile(a, b)
	require.NoError(t, err)
	require.False(t, same, "another memfd")
	require.NoError(t, d.Close())
	_, err = SameOpenFile(a, d)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = SameOpenFile(nil, a)
	require.ErrorIs(t, err, vmm.ErrInvalid)
}
