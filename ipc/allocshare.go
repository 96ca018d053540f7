package ipc

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// shareAlloc shares the plain allocation behind pin as one page. It asks
// the driver for a CUDA legacy IPC handle first; a driver without legacy
// IPC (vmm.ErrNotSupported: the host backend) is asked for the fd of a
// memory file holding the allocation, whose size is the page size. It
// unpins on failure.
func (e *Exporter) shareAlloc(drv vmm.Driver, pin Pin, ext Extent, once bool) (*Share, error) {
	var h vmm.IPCMemHandle
	ai, ipcErr := vmm.AllocIPCOf(drv)
	if ipcErr == nil {
		h, ipcErr = ai.ExportAllocIPC(pin.Alloc)
	}
	if ipcErr == nil {
		ext.PageSize = roundUp(pin.PageSize, handles.MinPageSize)
		return e.ShareCUDAIPC(handles.IPCHandle(h), ext, pin.Unpin)
	}
	if !errors.Is(ipcErr, vmm.ErrNotSupported) {
		return nil, errors.Join(fmt.Errorf("exporting the allocation at %v: %w", pin.Alloc, ipcErr), unpin(pin))
	}
	var raw int
	var size uint64
	af, err := vmm.AllocFDOf(drv)
	if err == nil {
		raw, size, err = af.ExportAllocFD(pin.Alloc)
	}
	var fd *handles.FD
	if err == nil {
		fd, err = handles.NewFD(raw)
	}
	if err != nil {
		err = fmt.Errorf("exporting the allocation at %v: no CUDA IPC (%v), and as an fd: %w", pin.Alloc, ipcErr, err)
		return nil, errors.Join(err, unpin(pin))
	}
	ext.PageSize = size
	return e.shareFDs([]*handles.FD{fd}, ext, pin.Unpin, once)
}

// ShareCUDAIPC shares one plain allocation named by its CUDA legacy IPC
// handle: the descriptor carries the handle (one page of ext.PageSize
// bytes, the allocation rounded up to handles.MinPageSize) and, if the
// exporter serves one, the socket, on which importers take their leases
// (ipc.Open does). release is as for ShareFDs.
func (e *Exporter) ShareCUDAIPC(h handles.IPCHandle, ext Extent, release func() error) (*Share, error) {
	s := &Share{e: e}
	s.mu.release = release
	s.desc = e.descriptor(handles.KindCUDAIPC, 1, ext)
	s.desc.IPC = h
	return s, e.add(s)
}

func roundUp(n, unit uint64) uint64 { return (n + unit - 1) / unit * unit }
