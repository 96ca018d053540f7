package ipc

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// Pin is the pages behind a block, held for sharing (see handles.Pin,
// where it is defined so that allocators need not import ipc).
type Pin = handles.Pin

// BlockSource is what an allocator implements so that its blocks can be
// shared (the expandable allocator is meant to).
type BlockSource interface {
	// PinBlock returns the pages behind the live block at ptr, rounded out
	// to whole pages, and keeps them from being reused, unmapped or
	// released until the Pin's Unpin is called, even if the block is freed
	// in between.
	PinBlock(ptr vmm.DevicePtr) (Pin, error)
}

// ShareBlock shares the live block at ptr of an allocator that implements
// BlockSource over drv. It exports the pages as fabric handles when the
// device can and every page allows it, and quietly falls back to posix fds
// otherwise; the fds come from the pin's ExportFD where the allocator
// keeps its exports. A block of plain allocations (a Pin with Alloc set: the
// fallback allocator) is shared as its whole allocation: a CUDA IPC handle
// where the driver has legacy IPC, else the fd of the memory file that
// holds it (the host backend); see shareAlloc. The share unpins the block
// when it closes and every lease has ended.
func (e *Exporter) ShareBlock(drv vmm.Driver, src BlockSource, ptr vmm.DevicePtr) (*Share, error) {
	return e.shareBlock(drv, src, ptr, false)
}

// ShareBlockOnce is ShareBlock for exactly one importer, as one
// torch.multiprocessing message is: the share closes once its importer
// holds its lease (CloseAfter(1)). A share of posix fds from an exporter
// with a socket is also claimable (handles.ClaimFor): the importer that
// fetches its pages by pidfd claims it and reads at once, with no wait for
// the exporter's answer, since the exporter serves that importer alone
// and keeps the pages for it until its request is served, or it exits,
// even past the share's Close. A second importer of the same descriptor
// is refused (ErrNotOffered).
func (e *Exporter) ShareBlockOnce(drv vmm.Driver, src BlockSource, ptr vmm.DevicePtr) (*Share, error) {
	s, err := e.shareBlock(drv, src, ptr, true)
	if err != nil {
		return nil, err
	}
	if err := s.CloseAfter(1, nil); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

func (e *Exporter) shareBlock(drv vmm.Driver, src BlockSource, ptr vmm.DevicePtr, once bool) (*Share, error) {
	pin, err := src.PinBlock(ptr)
	if err != nil {
		return nil, fmt.Errorf("sharing: %w", err) // PinBlock's errors name the block
	}
	info, err := drv.DeviceInfo(pin.Device)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("sharing block %v: %w", ptr, err), unpin(pin))
	}
	ext := Extent{DeviceUUID: info.UUID, PageSize: pin.PageSize, Spans: pin.Spans, Offset: pin.Offset, Length: pin.Length}
	if pin.Alloc != 0 {
		return e.shareAlloc(drv, pin, ext, once)
	}
	if info.Fabric {
		if fabs, ok := exportFabric(drv, pin.Pages); ok {
			return e.ShareFabric(fabs, ext, pin.Unpin)
		}
	}
	fds := make([]*handles.FD, 0, len(pin.Pages))
	export := pin.ExportFD
	if export == nil {
		export = func(i int) (int, error) { return drv.ExportFD(pin.Pages[i]) }
	}
	for i := range pin.Pages {
		raw, err := export(i)
		var fd *handles.FD
		if err == nil {
			fd, err = handles.NewFD(raw)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("exporting page %d of block %v: %w", i, ptr, err), handles.CloseAll(fds), unpin(pin))
		}
		fds = append(fds, fd)
	}
	return e.shareFDs(fds, ext, pin.Unpin, once)
}

// exportFabric exports every page as a fabric handle, or reports false.
func exportFabric(drv vmm.Driver, pages []vmm.Handle) ([]handles.Fabric, bool) {
	fabs := make([]handles.Fabric, len(pages))
	for i, h := range pages {
		fh, err := drv.ExportFabric(h)
		if err != nil {
			return nil, false
		}
		fabs[i] = handles.FabricOf(fh)
	}
	return fabs, true
}

func unpin(p Pin) error {
	if p.Unpin == nil {
		return nil
	}
	return p.Unpin()
}
