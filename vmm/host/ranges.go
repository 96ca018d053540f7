package host

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// The address-range state machine of the host backend (see package vmm for
// the states). In kernel terms:
//
//	none       no mapping at the addresses.
//	reserved   an anonymous PROT_NONE MAP_NORESERVE mapping: the addresses
//	           are taken, nothing is behind them, touching them faults.
//	mapped     a MAP_SHARED PROT_NONE mapping of the page's memfd at the
//	           page's offset: the bytes are behind the addresses, but
//	           touching them still faults.
//	accessible the same mapping after mprotect to PROT_READ or
//	           PROT_READ|PROT_WRITE.
//
// Each method below checks and records its transition in the ledger first
// (so that a misuse never reaches the kernel), then makes the system call,
// and on failure puts the ledger back, as the ledger's Begin/Undo pairs say.

// Reserve makes a range of size bytes aligned to align (0: the granularity):
// none -> reserved. It maps size+align bytes of reservation and trims the
// unaligned head and tail; if trimming fails it unmaps all of it, so on
// failure the addresses are back to none.
func (d *Driver) Reserve(size, align uint64) (vmm.DevicePtr, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	if err := d.books.CheckSize("reserving", size); err != nil {
		return 0, err
	}
	if align&(align-1) != 0 {
		return 0, fmt.Errorf("reserving %d bytes: alignment %d is not a power of two: %w", size, align, vmm.ErrInvalid)
	}
	align = max(align, d.opts.Granularity)
	if err := d.roomForMappings(fmt.Sprintf("reserving %d bytes", size), 1); err != nil {
		return 0, err
	}
	total := size + align
	if total < size {
		return 0, fmt.Errorf("reserving %d bytes aligned to %d: too large: %w", size, align, vmm.ErrInvalid)
	}
	base, err := reserveAnywhere(total)
	if err != nil {
		return 0, fmt.Errorf("reserving %d bytes: %w", total, sysErr(err))
	}
	start, _ := roundUp(uint64(base), align)
	if err := d.trim(base, total, uintptr(start), size); err != nil {
		return 0, err
	}
	ptr := vmm.DevicePtr(start)
	d.books.AddRange(ptr, size)
	return ptr, nil
}

// trim unmaps [base, start) and [start+size, base+total) of a fresh
// reservation; on failure it unmaps all of it.
func (d *Driver) trim(base uintptr, total uint64, start uintptr, size uint64) error {
	head := uint64(start - base)
	tail := total - head - size
	var err error
	if head > 0 {
		err = munmap(base, head)
	}
	if err == nil && tail > 0 {
		err = munmap(start+uintptr(size), tail)
	}
	if err == nil {
		return nil
	}
	return fmt.Errorf("trimming the reservation at %#x+%d to %#x+%d: %w (unmapping it: %v)",
		base, total, start, size, sysErr(err), munmap(base, total))
}

// Unreserve gives back a whole range made by Reserve: reserved -> none.
// Nothing in it may be mapped (ErrInUse). If munmap fails the range stays
// reserved.
func (d *Driver) Unreserve(ptr vmm.DevicePtr, size uint64) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	if err := d.books.BeginUnreserve(ptr, size); err != nil {
		return err
	}
	if err := munmap(uintptr(ptr), size); err != nil {
		d.books.UndoUnreserve(ptr, size)
		return fmt.Errorf("unreserving %v+%d: %w", ptr, size, sysErr(err))
	}
	return nil
}

// Map puts size bytes of page h from offset behind [ptr, ptr+size):
// reserved -> mapped (PROT_NONE). If mmap fails, the kernel may already have
// removed the reservation there; Map puts the reservation's mapping back and
// the range stays reserved.
func (d *Driver) Map(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.prot.Lock()
	defer d.prot.Unlock()
	if err := d.roomForMappings(fmt.Sprintf("mapping %d bytes at %v", size, ptr), 2); err != nil {
		return err
	}
	m, err := d.books.BeginMap(ptr, size, h, offset)
	if err != nil {
		return err
	}
	d.mu.Lock()
	b := *d.mu.pages[h] // live: the ledger just counted a mapping of it
	d.mu.Unlock()
	err = mapFile(uintptr(ptr), size, protNone, b.fd, b.offset+int64(offset))
	if err != nil {
		d.books.UndoMap(m)
		return fmt.Errorf("mapping %d bytes of page %#x at %v: %w", size, uint64(h), ptr, errors.Join(sysErr(err), unbacked(uintptr(ptr), size)))
	}
	return nil
}

// Unmap removes the mappings that exactly cover [ptr, ptr+size):
// mapped/accessible -> reserved. One mmap of the reservation's kind over the
// whole run replaces them; if it fails, none was removed and the ledger
// keeps them all.
func (d *Driver) Unmap(ptr vmm.DevicePtr, size uint64) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.prot.Lock()
	defer d.prot.Unlock()
	ms, err := d.books.BeginUnmap(ptr, size, nil)
	if err != nil {
		return err
	}
	if err := unbacked(uintptr(ptr), size); err != nil {
		d.books.UndoUnmap(ms)
		return fmt.Errorf("unmapping %d mappings at %v+%d: %w", len(ms), ptr, size, sysErr(err))
	}
	return nil
}
