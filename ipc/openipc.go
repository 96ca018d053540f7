package ipc

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// ErrOwnIPCHandle: a cuda-ipc descriptor was opened in the process that
// exported it. CUDA refuses that (cuIpcOpenMemHandle fails in the
// exporting process); the exporter uses the block's own address instead.
var ErrOwnIPCHandle = fmt.Errorf("a CUDA IPC handle cannot be opened in the process that exported it (use the block's own address there): %w", vmm.ErrInvalid)

// ipcOpen is one vmm.Driver.OpenAllocIPC of a handle in an Importer. The
// CUDA driver opens a handle once per process, and the mappings of
// several blocks of one allocation (several descriptors) name the same
// handle, so they share one open, counted by reference.
type ipcOpen struct {
	im   *Importer
	key  ipcKey
	base vmm.DevicePtr
	size uint64
	refs int // guarded by im.ipcMu
}

// ipcKey names an open in its Importer.
type ipcKey struct {
	dev vmm.Device
	h   handles.IPCHandle
}

// acquireIPC returns the open of h for dev, opening it on first use.
func (im *Importer) acquireIPC(dev vmm.Device, h handles.IPCHandle) (*ipcOpen, error) {
	im.ipcMu.Lock()
	defer im.ipcMu.Unlock()
	key := ipcKey{dev, h}
	if o := im.opens[key]; o != nil {
		o.refs++
		return o, nil
	}
	ai, err := vmm.AllocIPCOf(im.drv)
	if err != nil {
		return nil, fmt.Errorf("opening %v: %w", h, err)
	}
	base, size, err := ai.OpenAllocIPC(vmm.IPCMemHandle(h), dev)
	if err != nil {
		return nil, fmt.Errorf("opening %v on device %d: %w", h, dev, err)
	}
	o := &ipcOpen{im: im, key: key, base: base, size: size, refs: 1}
	im.opens[key] = o
	return o, nil
}

// release drops one reference and closes the open after the last. If the
// close fails the open stays registered, so a later Open reuses it.
func (o *ipcOpen) release() error {
	im := o.im
	im.ipcMu.Lock()
	defer im.ipcMu.Unlock()
	if o.refs--; o.refs > 0 {
		return nil
	}
	ai, err := vmm.AllocIPCOf(im.drv) // it has it: the open was made through it
	if err == nil {
		err = ai.CloseAllocIPC(o.base)
	}
	if err != nil {
		o.refs++
		return fmt.Errorf("closing the CUDA IPC allocation at %v: %w", o.base, err)
	}
	delete(im.opens, o.key)
	return nil
}

// openCUDAIPC does Open's work for a cuda-ipc descriptor: take the handle
// and the lease (Fetch), open the allocation (shared with other mappings
// of it in this process) and check that the block fits in it. The block
// is mapped read-write whatever opts.Access says: legacy IPC has no other
// mode. On failure it has undone everything.
func (m *mapped) openCUDAIPC(ctx context.Context, dev vmm.Device, opts OpenOptions) error {
	if m.desc.ExporterPID == os.Getpid() {
		return ErrOwnIPCHandle
	}
	r, err := Fetch(ctx, m.desc, opts.Fetch)
	if err != nil {
		return err
	}
	m.recv, m.via, m.leased = r, r.Via, r.Leased()
	o, err := m.im.acquireIPC(dev, r.IPC)
	if err != nil {
		return errors.Join(err, m.teardown(0))
	}
	m.ipc = o
	if end := m.desc.Offset + m.desc.Length; end > o.size {
		err = fmt.Errorf("the opened allocation has %d bytes, the block ends at byte %d: %w", o.size, end, vmm.ErrInvalid)
		return errors.Join(err, m.teardown(0))
	}
	m.base = o.base
	return nil
}

// teardownIPC undoes openCUDAIPC: drops the open and ends the lease. It
// is retryable: if closing the allocation fails, the open is kept (with
// its reference: release gives it back on failure) and the lease too, so
// the exporter keeps the block for us and a later call tries again.
func (m *mapped) teardownIPC() error {
	if m.ipc != nil {
		if err := m.ipc.release(); err != nil {
			return fmt.Errorf("kept open: %w", err)
		}
		m.ipc = nil
	}
	if m.recv != nil {
		if err := m.recv.Close(); err != nil {
			return err
		}
		m.recv = nil
	}
	return nil
}
