package ipc

import (
	"context"
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/internal/pagerun"
	"github.com/xseg-dev/xseg/vmm"
)

// open does Open's work for m: fetch, import, reserve, map, set access.
// On failure it has undone everything.
func (m *mapped) open(ctx context.Context, dev vmm.Device, opts OpenOptions) error {
	if m.desc.Kind == handles.KindCUDAIPC {
		return m.openCUDAIPC(ctx, dev, opts)
	}
	r, err := Fetch(ctx, m.desc, opts.Fetch)
	if err != nil {
		return err
	}
	m.recv, m.via, m.leased = r, r.Via, r.Leased()
	if err := m.importPages(); err != nil {
		return errors.Join(err, m.teardown(0))
	}
	// The imported handles keep the pages; the fds are no longer needed.
	err = handles.CloseAll(r.FDs)
	r.FDs = nil
	if err != nil {
		return errors.Join(err, m.teardown(0))
	}
	ps, size := m.desc.PageSize, m.desc.Bytes()
	if m.base, err = m.drv.Reserve(size, 0); err != nil {
		m.base = 0
		return errors.Join(fmt.Errorf("reserving the shared extent of %d bytes: %w", size, err), m.undo())
	}
	m.reserved = true
	access := opts.Access
	if access == vmm.AccessNone {
		access = vmm.AccessReadWrite
	}
	m.nmapped, err = pagerun.Map(m.drv, m.base, ps, m.pages, []vmm.AccessDesc{{Device: dev, Flags: access}})
	if err != nil {
		return errors.Join(fmt.Errorf("device %d: %w", dev, err), m.undo())
	}
	return nil
}

// undo tears down a failed open. Open returns no Mapping that a later
// Close could retry with, so a teardown that fails is tried once more at
// once; what fails again is in the error, and stays held.
func (m *mapped) undo() error {
	if err := m.teardown(m.nmapped); err == nil {
		return nil
	}
	return m.teardown(m.nmapped)
}

// importPages makes a driver handle of every fetched page, in page order.
// The handles made so far are in m.pages also when it fails.
func (m *mapped) importPages() error {
	r := m.recv
	if m.desc.Kind == handles.KindFabric {
		for i, f := range r.Fabric {
			h, err := m.drv.ImportFabric(f.Driver())
			if err != nil {
				return fmt.Errorf("importing the fabric handle of page %d (the exporter can share posix fds instead): %w", i, err)
			}
			m.pages = append(m.pages, h)
		}
		return nil
	}
	for i, fd := range r.FDs {
		h, err := m.drv.ImportFD(fd.Int())
		if err != nil {
			return fmt.Errorf("importing the fd of page %d: %w", i, err)
		}
		m.pages = append(m.pages, h)
	}
	return nil
}

// teardown undoes open as far as it got: unmaps the first n pages
// (mapped -> reserved), releases every imported page, gives back the range
// (reserved -> none), closes what was fetched and ends the lease. What
// fails stays in m (nmapped, pages, reserved, recv) for a later teardown
// to try again: if the unmap fails the pages stay mapped and are not
// released, and the range is kept, for releasing them would be an error;
// the lease ends only once nothing is held, protecting the pages until then.
func (m *mapped) teardown(n int) error {
	if m.desc.Kind == handles.KindCUDAIPC {
		return m.teardownIPC()
	}
	m.nmapped = n
	if err := pagerun.Unmap(m.drv, m.base, m.desc.PageSize, n); err != nil {
		return fmt.Errorf("kept mapped: %w", err)
	}
	m.nmapped = 0
	var errs []error
	keep := m.pages[:0]
	for _, h := range m.pages {
		if err := m.drv.Release(h); err != nil {
			errs = append(errs, fmt.Errorf("releasing imported page %#x: %w", uint64(h), err))
			keep = append(keep, h)
		}
	}
	clear(m.pages[len(keep):])
	m.pages = keep
	if m.reserved {
		if err := m.drv.Unreserve(m.base, m.desc.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("giving back the range at %v: %w", m.base, err))
		} else {
			m.reserved = false
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if m.recv != nil {
		err := m.recv.Close()
		m.recv = nil
		return err
	}
	return nil
}
