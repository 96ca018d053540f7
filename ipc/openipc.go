package ipc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"sync"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// ErrOwnIPCHandle: a cuda-ipc descriptor was opened in the process that
// exported it. CUDA refuses that (cuIpcOpenMemHandle fails in the
// exporting process); the exporter uses the block's own address instead.
var ErrOwnIPCHandle = fmt.Errorf("a CUDA IPC handle cannot be opened in the process that exported it (use the block's own address there): %w", vmm.ErrInvalid)

// ipcOpen is one vmm.Driver.OpenAllocIPC of a handle in this process. The
// CUDA driver opens a handle once per process, and the mappings of
// several blocks of one allocation (several descriptors) name the same
// handle, so they share one open, counted by reference.
type ipcOpen struct {
	key  any // ipcKey, nil if the driver is not comparable
	drv  vmm.AllocIPC
	base vmm.DevicePtr
	size uint64
	refs int // guarded by ipcOpens
}

type ipcKey struct {
	drv vmm.Driver
	dev vmm.Device
	h   handles.IPCHandle
}

// ipcOpens holds every live ipcOpen by key. Its lock is held across the
// driver's open and close, which serializes them process-wide; they are
// rare, and it keeps an open from racing the close of the same handle.
var ipcOpens struct {
	sync.Mutex
	m map[ipcKey]*ipcOpen
}

// acquireIPC returns the open of h on drv for dev, opening it on first use.
func acquireIPC(drv vmm.Driver, dev vmm.Device, h handles.IPCHandle) (*ipcOpen, error) {
	ipcOpens.Lock()
	defer ipcOpens.Unlock()
	var key any
	if t := reflect.TypeOf(drv); t != nil && t.Comparable() {
		k := ipcKey{drv, dev, h}
		if o := ipcOpens.m[k]; o != nil {
			o.refs++
			return o, nil
		}
		key = k
	}
	ai, err := vmm.AllocIPCOf(drv)
	if err != nil {
		return nil, fmt.Errorf("opening %v: %w", h, err)
	}
	base, size, err := ai.OpenAllocIPC(vmm.IPCMemHandle(h), dev)
	if err != nil {
		return nil, fmt.Errorf("opening %v on device %d: %w", h, dev, err)
	}
	o := &ipcOpen{key: key, drv: ai, base: base, size: size, refs: 1}
	if key != nil {
		if ipcOpens.m == nil {
			ipcOpens.m = make(map[ipcKey]*ipcOpen)
		}
		ipcOpens.m[key.(ipcKey)] = o
	}
	return o, nil
}

// release drops one reference and closes the open after the last. If the
// close fails the open stays registered, so a later Open reuses it.
func (o *ipcOpen) release() error {
	ipcOpens.Lock()
	defer ipcOpens.Unlock()
	if o.refs--; o.refs > 0 {
		return nil
	}
	if err := o.drv.CloseAllocIPC(o.base); err != nil {
		o.refs++
		return fmt.Errorf("closing the CUDA IPC allocation at %v: %w", o.base, err)
	}
	if o.key != nil {
		delete(ipcOpens.m, o.key.(ipcKey))
	}
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
	o, err := acquireIPC(m.drv, dev, r.IPC)
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
