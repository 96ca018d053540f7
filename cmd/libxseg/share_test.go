//go:build cgo

package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/ipc"
	"github.com/xseg-dev/xseg/vmm"
)

// Issue 15: xseg_open with a NULL ptr crashed, and with a NULL size opened
// the mapping, panicked and left it without a handle. Every argument is
// checked before anything is opened.
func TestCheckOpenArgs(t *testing.T) {
	desc := unsafe.Pointer(new([8]byte))
	for _, c := range []struct {
		desc      unsafe.Pointer
		n         uint64
		ptr, size bool
		want      string
	}{
		{nil, 8, true, true, "desc is NULL"},
		{desc, 0, true, true, "descriptor of 0 bytes"},
		{desc, maxDescLen + 1, true, true, "descriptor of 16777217 bytes"},
		{desc, 8, false, true, "ptr is NULL"},
		{desc, 8, true, false, "size is NULL"},
	} {
		err := checkOpenArgs(c.desc, c.n, c.ptr, c.size)
		require.ErrorIs(t, err, vmm.ErrInvalid, c.want)
		require.ErrorContains(t, err, c.want)
	}
	require.NoError(t, checkOpenArgs(desc, 8, true, true))
}

func TestOpenExportOpensNothingOnBadArgs(t *testing.T) {
	desc := []byte("not a descriptor")
	require.EqualValues(t, -1, xsegGoOpen(unsafe.Pointer(&desc[0]), 16, 0, nil, nil, 1))
	require.Equal(t, "xseg_open: ptr is NULL (it receives the mapping's address): invalid argument", lastErr.text())
	require.EqualValues(t, -1, xsegGoOpen(nil, 16, 0, nil, nil, 0))
	require.Contains(t, lastErr.text(), "desc is NULL")
	lib.mu.Lock()
	started := lib.mu.started
	lib.mu.Unlock()
	require.False(t, started, "the library was not even started")
	shared.mu.Lock()
	defer shared.mu.Unlock()
	require.Empty(t, shared.mu.mappings)
}

// Issue 15: sharing a block of an allocator that is not shareable failed as
// "pinning block X: pinning block X: ...": ipc wrapped PinBlock's error,
// which names the block already.
func TestLibraryShareNotShareableMessage(t *testing.T) {
	l := hostLibrary(t, nil)
	p, err := l.malloc(4096, 0, 0)
	require.NoError(t, err)
	var src ipc.BlockSource = l.devs[0].Load().a
	exp, err := ipc.NewExporter(ipc.ExporterOptions{})
	require.NoError(t, err)
	defer exp.Close()
	_, err = exp.ShareBlock(l.driver(), src, p)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.Equal(t, 1, strings.Count(err.Error(), "pinning block"), err.Error())
	require.ErrorContains(t, err, fmt.Sprintf("sharing: pinning block %v: allocator not configured shareable", p))
	require.NoError(t, l.free(p, 0))
}

// Audit C, D6: xseg_share_for(p, 0, 1<<20 + 1, ...) said only "1048577
// importers: invalid argument"; it names the range allowed.
func TestShareImportersRange(t *testing.T) {
	var buf [64]byte
	require.EqualValues(t, -1, xsegGoShare(0x1000, 0, maxImporters+1, unsafe.Pointer(&buf[0]), 64))
	require.Equal(t, "xseg_share: 0x1000 on device 0: importers 1048577: want 0 to 1048576 (0: until xseg_unshare): invalid argument",
		lastErr.text())
	require.EqualValues(t, -1, xsegGoShare(0x1000, 0, -1, unsafe.Pointer(&buf[0]), 64))
	require.Contains(t, lastErr.text(), "importers -1: want 0 to 1048576")
}

// Audit C, D6: an open that failed by every transport put a newline
// between the causes (errors.Join) inside the one-line xseg_last_error
// text; oneLine joins them with "; " and keeps them for errors.Is.
func TestOneLine(t *testing.T) {
	pidfd := fmt.Errorf("pidfd: pidfd_open(31197): %w", vmm.ErrNotSupported)
	socket := fmt.Errorf("socket: dial unixpacket @xseg-1: %w", vmm.ErrInvalid)
	err := oneLine(fmt.Errorf("on device 0: fetching 2 pages: %w", errors.Join(pidfd, socket)))
	require.Equal(t, "on device 0: fetching 2 pages: pidfd: pidfd_open(31197): not supported; socket: dial unixpacket @xseg-1: invalid argument", err.Error())
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	fail("xseg_open", err)
	require.NotContains(t, lastErr.text(), "\n")
	plain := fmt.Errorf("no mapping has handle 7: %w", vmm.ErrInvalid)
	require.Same(t, plain, oneLine(plain), "an error of one line stays as it is")
	require.NoError(t, oneLine(nil))
}
