package vmmtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// TestFaultyOverDriverWithoutOptionals: a driver with none of the optional
// interfaces (a plain vmm.Driver hides the host backend's AllocFD and
// AsyncMemsetter) makes Faulty's forwarding methods answer ErrNotSupported,
// and the vmm helpers agree; over the host backend itself AllocFD and
// AsyncMemsetter are found and AllocIPC is not.
func TestFaultyOverDriverWithoutOptionals(t *testing.T) {
	h := HostDriver(t, 64<<20)
	bare := struct{ vmm.Driver }{h}
	f := NewFaulty(bare)
	p, err := f.MemAlloc(0, 4096)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.MemFree(p)) }()
	_, _, err = f.ExportAllocFD(p)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	_, err = f.ExportAllocIPC(p)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	_, _, err = f.OpenAllocIPC(vmm.IPCMemHandle{1}, 0)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.ErrorIs(t, f.CloseAllocIPC(p), vmm.ErrNotSupported)
	require.ErrorIs(t, f.MemsetAsync(p, 1, 16, 0), vmm.ErrNotSupported)
	require.ErrorIs(t, MemsetAsync(bare, p, 1, 16, 0), vmm.ErrNotSupported)

	_, err = vmm.AllocFDOf(h)
	require.NoError(t, err)
	_, err = vmm.AsyncMemsetterOf(h)
	require.NoError(t, err)
	_, err = vmm.AllocIPCOf(h)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.NoError(t, MemsetAsync(NewFaulty(h), p, 1, 16, 0), "Faulty over the host backend forwards")
}
