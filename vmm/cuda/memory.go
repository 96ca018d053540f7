package cuda

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// The methods below move address ranges and pages through the state
// machine of package vmm. Each checks and records the transition in the
// ledger first (so a misuse never reaches the driver), then calls the
// driver, and on failure puts the ledger back as it was. The VMM entry
// points are not tied to a context: they run in the calling thread's
// context if it has one, else in device 0's primary context.

// Reserve reserves size bytes of address space, aligned to align (0: the
// granularity; smaller alignments are raised to it). none -> reserved.
// Nothing is recorded if cuMemAddressReserve fails.
func (d *Driver) Reserve(size, align uint64) (vmm.DevicePtr, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	if err := d.books.CheckSize("reserving", size); err != nil {
		return 0, err
	}
	if align&(align-1) != 0 {
		return 0, fmt.Errorf("reserving %d bytes: alignment %d is not a power of two: %w", size, align, vmm.ErrInvalid)
	}
	align = max(align, d.books.Granularity())
	if s := d.devs[0].Load(); s != nil && !s.vmm {
		return 0, fmt.Errorf("reserving %d bytes: device 0 has no virtual memory management: %w", size, vmm.ErrNotSupported)
	}
	ptr, err := d.sym.memAddressReserve(0, size, align)
	if err != nil {
		return 0, fmt.Errorf("cuMemAddressReserve of %d bytes aligned to %d: %w", size, align, err)
	}
	d.books.AddRange(ptr, size)
	return ptr, nil
}

// Unreserve frees a whole reservation with nothing mapped in it.
// reserved -> none. If cuMemAddressFree fails the range stays reserved.
func (d *Driver) Unreserve(ptr vmm.DevicePtr, size uint64) error {
	if err := d.live(); err != nil {
		return err
	}
	if err := d.books.BeginUnreserve(ptr, size); err != nil {
		return err
	}
	if err := d.sym.memAddressFree(0, ptr, size); err != nil {
		d.books.UndoUnreserve(ptr, size)
		return fmt.Errorf("cuMemAddressFree %v+%d: %w", ptr, size, err)
	}
	return nil
}

// Create makes a physical page of size bytes on dev with cuMemCreate,
// exportable as types, and GPUDirect RDMA capable where the device supports
// that with VMM.
func (d *Driver) Create(dev vmm.Device, size uint64, types vmm.HandleType) (vmm.Handle, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	if err := d.books.CheckSize("page", size); err != nil {
		return 0, err
	}
	if err := s.canCreate(size, types); err != nil {
		return 0, err
	}
	h, err := d.sym.memCreate(0, size, s.cu, types, s.rdma)
	if err != nil {
		return 0, fmt.Errorf("cuMemCreate of %d bytes on device %d (%v): %w", size, dev, types, err)
	}
	d.books.AddPage(h, dev, size, types)
	return h, nil
}

// canCreate answers what the device cannot do without asking the driver.
func (s *device) canCreate(size uint64, types vmm.HandleType) error {
	switch {
	case !s.vmm:
		return fmt.Errorf("creating a page on device %d: no virtual memory management: %w", s.ord, vmm.ErrNotSupported)
	case types&^(vmm.HandlePosixFD|vmm.HandleFabric) != 0:
		return fmt.Errorf("creating a page on device %d: unknown handle types %v: %w", s.ord, types, vmm.ErrInvalid)
	case types&vmm.HandlePosixFD != 0 && !s.posixFD:
		return fmt.Errorf("creating a page on device %d: no POSIX fd handles: %w", s.ord, vmm.ErrNotSupported)
	case types&vmm.HandleFabric != 0 && !s.fabric:
		return fmt.Errorf("creating a page on device %d: no fabric handles: %w", s.ord, vmm.ErrNotSupported)
	case size > s.total:
		return fmt.Errorf("creating a page of %d bytes on device %d: it has %d bytes: %w", size, s.ord, s.total, vmm.ErrOutOfMemory)
	}
	return nil
}

// Release destroys a page that is not mapped. If cuMemRelease fails the
// page stays live.
func (d *Driver) Release(h vmm.Handle) error {
	if err := d.live(); err != nil {
		return err
	}
	p, err := d.books.BeginRelease(h)
	if err != nil {
		return err
	}
	if err := d.sym.memRelease(0, h); err != nil {
		d.books.UndoRelease(p)
		return fmt.Errorf("cuMemRelease %#x: %w", uint64(h), err)
	}
	return nil
}

// Map maps size bytes of page h from offset at ptr. reserved -> mapped.
// If cuMemMap fails nothing is recorded. The CUDA driver maps whole pages
// only: a map from an offset other than 0, or of less than the page, fails
// with the driver's CUDA_ERROR_NOT_SUPPORTED (vmm.ErrNotSupported).
func (d *Driver) Map(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) error {
	if err := d.live(); err != nil {
		return err
	}
	m, err := d.books.BeginMap(ptr, size, h, offset)
	if err != nil {
		return err
	}
	if err := d.sym.memMap(0, ptr, size, offset, h); err != nil {
		d.books.UndoMap(m)
		hint := ""
		if errors.Is(err, vmm.ErrNotSupported) {
			hint = " (CUDA maps whole pages only: offset 0, the page's size)"
		}
		return fmt.Errorf("cuMemMap %v+%d of page %#x from offset %d%s: %w", ptr, size, uint64(h), offset, hint, err)
	}
	return nil
}

// Unmap unmaps the mappings that exactly cover [ptr, ptr+size), one
// cuMemUnmap per mapping. mapped/accessible -> reserved. If one fails, the
// mappings before it are gone and it and the rest stay mapped.
func (d *Driver) Unmap(ptr vmm.DevicePtr, size uint64) error {
	if err := d.live(); err != nil {
		return err
	}
	var buf [4]ledger.Mapping // room for the usual few, on the stack
	ms, err := d.books.BeginUnmap(ptr, size, buf[:0])
	if err != nil {
		return err
	}
	for i, m := range ms {
		if err := d.sym.memUnmap(0, m.Ptr, m.Size); err != nil {
			d.books.UndoUnmap(ms[i:])
			return fmt.Errorf("cuMemUnmap %v+%d (mapping %d of %d in %v+%d; %d unmapped, %d still mapped): %w",
				m.Ptr, m.Size, i+1, len(ms), ptr, size, i, len(ms)-i, err)
		}
	}
	return nil
}

// SetAccess grants the listed devices access to [ptr, ptr+size), covered
// by mappings, in one cuMemSetAccess call. mapped -> accessible. If it
// fails, the ledger keeps the access the mappings had before.
func (d *Driver) SetAccess(ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) error {
	if err := d.live(); err != nil {
		return err
	}
	for _, a := range access {
		if a.Device < 0 || int(a.Device) >= d.count {
			return fmt.Errorf("setting access at %v: device %d: the driver has %d devices: %w", ptr, a.Device, d.count, vmm.ErrInvalid)
		}
	}
	undo, err := d.books.GrantAccess(ptr, size, access)
	if err != nil {
		return err
	}
	if err := d.sym.memSetAccess(0, ptr, size, access); err != nil {
		d.books.RestoreAccess(undo)
		return fmt.Errorf("cuMemSetAccess %v+%d for %v: %w", ptr, size, access, err)
	}
	return nil
}

// ExportFD returns a new close-on-exec file descriptor for page h, created
// with vmm.HandlePosixFD. The caller owns it.
func (d *Driver) ExportFD(h vmm.Handle) (int, error) {
	if err := d.live(); err != nil {
		return -1, err
	}
	p, err := d.books.Page(h)
	if err != nil {
		return -1, err
	}
	if p.Types&vmm.HandlePosixFD == 0 {
		return -1, fmt.Errorf("exporting page %#x as an fd: created as %v: %w", uint64(h), p.Types, vmm.ErrInvalid)
	}
	fd, err := d.sym.memExportFD(0, h)
	if err != nil {
		return -1, fmt.Errorf("cuMemExportToShareableHandle(%#x, posix fd): %w", uint64(h), err)
	}
	return fd, nil
}

// ImportFD makes a handle for the page that fd names; fd stays the
// caller's. The driver does not tell an imported page's size, so the books
// record the device's memory size as an upper bound: a Map beyond the
// page's real end is refused by the driver (vmm.ErrInvalid), and Usage
// counts the page with that bound.
func (d *Driver) ImportFD(fd int) (vmm.Handle, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	if fd < 0 {
		return 0, fmt.Errorf("importing fd %d: %w", fd, vmm.ErrInvalid)
	}
	h, err := d.sym.memImportFD(0, fd)
	if err != nil {
		return 0, fmt.Errorf("cuMemImportFromShareableHandle(fd %d): %w", fd, err)
	}
	if err := d.recordImport(h, vmm.HandlePosixFD); err != nil {
		return 0, err
	}
	return h, nil
}

// ExportFabric returns the fabric handle of a page created with
// vmm.HandleFabric.
func (d *Driver) ExportFabric(h vmm.Handle) (vmm.FabricHandle, error) {
	if err := d.live(); err != nil {
		return vmm.FabricHandle{}, err
	}
	p, err := d.books.Page(h)
	if err != nil {
		return vmm.FabricHandle{}, err
	}
	if p.Types&vmm.HandleFabric == 0 {
		if s := d.devs[p.Device].Load(); s != nil && !s.fabric {
			return vmm.FabricHandle{}, fmt.Errorf("exporting page %#x as a fabric handle: device %d has no fabric handles: %w", uint64(h), p.Device, vmm.ErrNotSupported)
		}
		return vmm.FabricHandle{}, fmt.Errorf("exporting page %#x as a fabric handle: created as %v: %w", uint64(h), p.Types, vmm.ErrInvalid)
	}
	fh, err := d.sym.memExportFabric(0, h)
	if err != nil {
		return vmm.FabricHandle{}, fmt.Errorf("cuMemExportToShareableHandle(%#x, fabric): %w", uint64(h), err)
	}
	return fh, nil
}

// ImportFabric makes a handle for the page fh names. As with ImportFD, the
// books record an upper bound of its size.
func (d *Driver) ImportFabric(fh vmm.FabricHandle) (vmm.Handle, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	if !d.devs[0].Load().fabric {
		return 0, fmt.Errorf("importing a fabric handle: device 0 has no fabric handles: %w", vmm.ErrNotSupported)
	}
	h, err := d.sym.memImportFabric(0, fh)
	if err != nil {
		return 0, fmt.Errorf("cuMemImportFromShareableHandle(fabric): %w", err)
	}
	if err := d.recordImport(h, vmm.HandleFabric); err != nil {
		return 0, err
	}
	return h, nil
}

// recordImport enters an imported page in the books, with its device and
// handle types from the driver (which may report none: the page can be
// passed on as the kind it came as). If that fails, it releases the page.
func (d *Driver) recordImport(h vmm.Handle, came vmm.HandleType) error {
	if _, err := d.books.Page(h); err == nil {
		// The driver may hand back the handle of a page this process
		// already holds; the books keep one entry a handle, and releasing
		// it here could destroy the original.
		return fmt.Errorf("importing: the driver returned handle %#x of a page that is already live here: %w", uint64(h), vmm.ErrInUse)
	}
	dev, types, err := d.sym.memAllocationProperties(0, h)
	if err == nil {
		var s *device
		if s, err = d.device(dev); err == nil {
			bound := s.total &^ (d.books.Granularity() - 1)
			d.books.AddImportedPage(h, dev, bound, types|came)
			return nil
		}
	} else {
		err = fmt.Errorf("cuMemGetAllocationPropertiesFromHandle(%#x): %w", uint64(h), err)
	}
	if rerr := d.sym.memRelease(0, h); rerr != nil {
		return fmt.Errorf("%w (and cuMemRelease of the imported handle: %v)", err, rerr)
	}
	return err
}
