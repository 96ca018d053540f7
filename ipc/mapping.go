package ipc

import (
	"context"
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/handles"
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
		return errors.Join(fmt.Errorf("reserving the shared extent of %d bytes: %w", size, err), m.teardown(0))
	}
	for i, h := range m.pages {
		at := m.base.Add(uint64(i) * ps)
		if err := m.drv.Map(at, ps, h, 0); err != nil {
			return errors.Join(fmt.Errorf("mapping page %d of %d at %v: %w", i+1, len(m.pages), at, err), m.teardown(i))
		}
	}
	access := opts.Access
	if access == vmm.AccessNone {
		access = vmm.AccessReadWrite
	}
	if err := m.drv.SetAccess(m.base, size, []vmm.AccessDesc{{Device: dev, Flags: access}}); err != nil {
		err = fmt.Errorf("setting access of device %d to %d pages at %v: %w", dev, len(m.pages), m.base, err)
		return errors.Join(err, m.teardown(len(m.pages)))
	}
	return nil
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

// teardown undoes open: unmaps the first n pages (mapped -> reserved),
// releases every imported page, gives back the range (reserved -> none),
// closes what was fetched and ends the lease. If the unmap fails the pages
// stay mapped and are not released, and the range is kept: releasing
// them would be an error, and the lease goes on protecting them.
func (m *mapped) teardown(n int) error {
	if m.desc.Kind == handles.KindCUDAIPC {
		return m.teardownIPC()
	}
	if n > 0 {
		if err := m.drv.Unmap(m.base, uint64(n)*m.desc.PageSize); err != nil {
			return fmt.Errorf("unmapping %d pages at %v (kept mapped): %w", n, m.base, err)
		}
	}
	var errs []error
	for i, h := range m.pages {
		if err := m.drv.Release(h); err != nil {
			errs = append(errs, fmt.Errorf("releasing imported page %d: %w", i, err))
		}
	}
	m.pages = nil
	if m.base != 0 {
		if err := m.drv.Unreserve(m.base, m.desc.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("giving back the range at %v: %w", m.base, err))
		}
	}
	if m.recv != nil {
		errs = append(errs, m.recv.Close())
	}
	return errors.Join(errs...)
}
