package cuda

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// ExportAllocIPC returns the legacy IPC handle (cuIpcGetMemHandle) of the
// plain allocation that starts at ptr, which MemAlloc returned (else
// vmm.ErrInvalid). The handle names the whole allocation; the allocation
// stays this process's, and MemFree frees it as usual (importers that
// still have it open keep their mapping until they close it).
func (d *Driver) ExportAllocIPC(ptr vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	if err := d.live(); err != nil {
		return vmm.IPCMemHandle{}, err
	}
	if _, err := d.books.Alloc("exporting the allocation at", ptr); err != nil {
		return vmm.IPCMemHandle{}, err
	}
	h, err := d.sym.ipcGetMemHandle(0, ptr)
	if err != nil {
		return vmm.IPCMemHandle{}, fmt.Errorf("cuIpcGetMemHandle of the allocation at %v: %w", ptr, err)
	}
	return h, nil
}

// OpenAllocIPC opens the allocation of another process that h names in
// dev's primary context (cuIpcOpenMemHandle, peer access enabled lazily)
// and returns its base and size (cuMemGetAddressRange). The CUDA driver
// refuses a handle exported by this very process (typically
// CUDA_ERROR_INVALID_CONTEXT) and, depending on its version, a handle
// already open here; a second open that the driver answers with an
// address already in the books is undone and refused with vmm.ErrInUse.
// Usage counts the open until CloseAllocIPC.
func (d *Driver) OpenAllocIPC(h vmm.IPCMemHandle, dev vmm.Device) (vmm.DevicePtr, uint64, error) {
	if err := d.live(); err != nil {
		return 0, 0, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, 0, err
	}
	if h == (vmm.IPCMemHandle{}) {
		return 0, 0, fmt.Errorf("opening an IPC handle: all zero: %w", vmm.ErrInvalid)
	}
	p, err := d.sym.ipcOpenMemHandle(s.ctx, h)
	if err != nil {
		return 0, 0, fmt.Errorf("cuIpcOpenMemHandle on device %d: %w", dev, err)
	}
	base, size, err := d.sym.memGetAddressRange(s.ctx, p)
	if err == nil && base != p {
		err = fmt.Errorf("the opened allocation starts at %v, not at %v: %w", base, p, vmm.ErrInvalid)
	}
	if err == nil {
		err = d.books.AddIPCOpen(p, size)
	}
	if err != nil {
		return 0, 0, errors.Join(fmt.Errorf("opening an IPC handle on device %d at %v: %w", dev, p, err),
			d.sym.ipcCloseMemHandle(s.ctx, p))
	}
	return p, size, nil
}

// CloseAllocIPC closes an allocation opened by OpenAllocIPC
// (cuIpcCloseMemHandle); any other pointer is vmm.ErrInvalid. If the
// driver fails, the allocation stays open.
func (d *Driver) CloseAllocIPC(ptr vmm.DevicePtr) error {
	if err := d.live(); err != nil {
		return err
	}
	size, err := d.books.BeginCloseIPC(ptr)
	if err != nil {
		return err
	}
	if err := d.sym.ipcCloseMemHandle(0, ptr); err != nil {
		d.books.UndoCloseIPC(ptr, size)
		return fmt.Errorf("cuIpcCloseMemHandle %v: %w", ptr, err)
	}
	return nil
}
