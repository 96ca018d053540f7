package ipc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/internal/pagerun"
	"github.com/xseg-dev/xseg/vmm"
)

// open does Open's work for m: fetch, reserve, then import every
// allocation, map each whole and set access (pagerun.MapSpans). On failure
// it has undone everything.
func (m *mapped) open(ctx context.Context, dev vmm.Device, opts OpenOptions) error {
	if m.desc.Kind == handles.KindCUDAIPC {
		return m.openCUDAIPC(ctx, dev, opts)
	}
	t0 := time.Now()
	r, err := fetch(ctx, m.desc, opts.Fetch, true)
	if err != nil {
		return err
	}
	t1 := time.Now()
	m.stages.Fetch = t1.Sub(t0)
	m.recv, m.via, m.leased, m.claimed = r, r.Via, r.Leased(), r.Claimed()
	access := m.key.access // the default filled in (mapAccess)
	m.access = access
	if m.desc.Kind == handles.KindPosixFD && m.im.opts.KeepFor > 0 {
		if k := m.im.takeKept(m.desc, dev, access, r.FDs); k != nil {
			err = m.adopt(k, r)
			return m.finish(ctx, err, time.Now())
		}
	}
	ps, size := m.desc.PageSize, m.desc.Bytes()
	m.base, err = m.drv.Reserve(size, 0)
	t0 = time.Now()
	m.stages.Reserve = t0.Sub(t1)
	if err != nil {
		m.base = 0
		return errors.Join(fmt.Errorf("reserving the shared extent of %d bytes: %w", size, err), m.undo())
	}
	m.reserved = true
	n := len(r.FDs)
	if m.desc.Kind == handles.KindFabric {
		n = len(r.Fabric)
	}
	m.pages = make([]vmm.Handle, n)
	m.nmapped, err = pagerun.MapSpans(m.drv, m.base, ps, m.desc.Spans, m.pages, []vmm.AccessDesc{{Device: dev, Flags: access}},
		pagerun.Source{Take: m.importPage, Give: m.releasePages})
	t1 = time.Now()
	m.stages.Map = t1.Sub(t0) - m.stages.Import
	if err != nil {
		return errors.Join(fmt.Errorf("device %d: %w", dev, err), m.undo())
	}
	// The imported handles keep the pages; the fds are no longer needed,
	// but where the mapping may be kept (keep.go) they tell a later share
	// of the same allocations.
	if m.im.keepable(m, r.FDs) {
		m.keepFDs, r.FDs = r.FDs, nil
	} else {
		err = handles.CloseAll(r.FDs)
		r.FDs = nil
	}
	return m.finish(ctx, err, t1)
}

// finish ends an open whose pages are mapped (err: of the step before):
// it waits for the lease, asked for after the fds were fetched and
// answered while they were mapped, so that nobody reads the pages before
// it is held; the end of ctx stops the wait. On failure it undoes everything.
func (m *mapped) finish(ctx context.Context, err error, t1 time.Time) error {
	if err == nil && m.deferLease {
		m.stages.Lease = time.Since(t1)
		return nil // AwaitLease reads the answer
	}
	if err == nil {
		m.leaseDone = true
		err = m.recv.awaitLease(ctx)
		m.leased = m.recv.Leased()
		m.stages.Lease = time.Since(t1)
	}
	if err != nil {
		return errors.Join(err, m.undo())
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

// importPage makes a driver handle of fetched page i: ImportFabric for a
// fabric descriptor, ImportFD otherwise.
func (m *mapped) importPage(i int) (vmm.Handle, error) {
	t0 := time.Now()
	defer func() { m.stages.Import += time.Since(t0) }()
	if m.desc.Kind == handles.KindFabric {
		h, err := m.drv.ImportFabric(m.recv.Fabric[i].Driver())
		if err != nil {
			return 0, fmt.Errorf("importing the fabric handle of page %d (the exporter can share posix fds instead): %w", i, err)
		}
		return h, nil
	}
	h, err := m.drv.ImportFD(m.recv.FDs[i].Int())
	if err != nil {
		return 0, fmt.Errorf("importing the fd of page %d: %w", i, err)
	}
	return h, nil
}

// releasePages releases imported pages that are not mapped and clears
// their places; a page that fails to release keeps its place, for the
// teardown to release again.
func (m *mapped) releasePages(hs []vmm.Handle) error {
	var errs []error
	for i, h := range hs {
		if h == 0 {
			continue
		}
		if err := m.drv.Release(h); err != nil {
			errs = append(errs, fmt.Errorf("releasing imported page %#x: %w", uint64(h), err))
			continue
		}
		hs[i] = 0
	}
	return errors.Join(errs...)
}

// teardown undoes open as far as it got: unmaps the first n allocations
// (mapped -> reserved; with one call, whatever their spans), releases
// every imported one, gives back the range
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
	if err := pagerun.UnmapSpans(m.drv, m.base, m.desc.PageSize, m.desc.Spans, n); err != nil {
		return fmt.Errorf("kept mapped: %w", err)
	}
	m.nmapped = 0
	var errs []error
	if err := m.releasePages(m.pages); err != nil {
		errs = append(errs, err)
	}
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
	if m.keepFDs != nil {
		err := handles.CloseAll(m.keepFDs)
		m.keepFDs = nil
		if err != nil {
			return err
		}
	}
	m.leaseMu.Lock() // AwaitLease reads recv
	defer m.leaseMu.Unlock()
	if m.recv != nil {
		err := m.recv.Close()
		m.recv = nil
		return err
	}
	return nil
}
