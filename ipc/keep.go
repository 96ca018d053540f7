package ipc

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// Kept mappings (ImporterOptions.KeepFor). A producer that sends tensor
// after tensor through torch.multiprocessing reuses its memory, so the
// next share often names the very allocations the last one did. An
// Importer with KeepFor set does not tear a posix-fd mapping down when its
// last Mapping closes: it ends the lease (the exporter may reuse the pages
// at once, as before) and keeps the imported allocations mapped, the range
// reserved and its copy of each allocation's fd, for up to KeepFor. An
// Open whose fetched fds are the same open files as a kept mapping's (kcmp:
// a dup of the exporter's kept export is the same file; another allocation
// never is, and cannot be while the kept copy holds the file) takes the
// kept mapping over instead of reserving, importing, mapping and granting
// access again. Safety is the lease's, as for any open: the new share's
// lease is taken before Open returns, and nobody reads the kept pages
// between two shares.
//
// What it costs: a kept mapping holds its exporter's allocations. While
// the exporter keeps them (its allocator caches free pages) that costs no
// memory; if the exporter releases one, the device gets it back only once
// the kept mapping goes: after KeepFor, when KeepMax newer ones push it
// out, or at DropKept (cmd/libxseg calls it from xseg_empty_cache).

// DefaultKeepMax is how many mappings an Importer keeps at most when
// ImporterOptions.KeepMax is 0.
const DefaultKeepMax = 8

// maxKeptAllocations: a share of more allocations than this is torn down
// at its last close, not kept (a kept mapping holds one fd an allocation).
const maxKeptAllocations = 8

// ImporterOptions tune an Importer (NewImporterWith). The zero value keeps
// nothing: every mapping is torn down when its last Mapping closes.
type ImporterOptions struct {
	// KeepFor: how long a posix-fd mapping whose last Mapping closed stays
	// mapped for a later share of the same allocations (see above); 0:
	// none is kept. Shares of more than 8 allocations are never kept.
	KeepFor time.Duration
	// KeepMax: the most mappings kept at once, the oldest dropped first;
	// 0: DefaultKeepMax.
	KeepMax int
	// OnError is told of a kept mapping that failed to tear down when it
	// expired (it stays held; DropKept tries it again). Nil: ignored.
	OnError func(error)
}

// NewImporterWith is NewImporter with options.
func NewImporterWith(drv vmm.Driver, opts ImporterOptions) (*Importer, error) {
	if opts.KeepFor < 0 || opts.KeepMax < 0 {
		return nil, fmt.Errorf("importer options: KeepFor %v and KeepMax %d must not be negative: %w", opts.KeepFor, opts.KeepMax, vmm.ErrInvalid)
	}
	if opts.KeepMax == 0 {
		opts.KeepMax = DefaultKeepMax
	}
	im := NewImporter(drv)
	im.opts = opts
	return im, nil
}

// Kept is how many mappings the importer keeps now (torn-down failures
// included).
func (im *Importer) Kept() int {
	im.mu.Lock()
	defer im.mu.Unlock()
	return len(im.kept) + len(im.stuck)
}

// DropKept tears down every kept mapping now. What fails to tear down stays
// held, for a later DropKept; the error says what.
func (im *Importer) DropKept() error {
	im.mu.Lock()
	all := slices.Concat(im.kept, im.stuck)
	im.kept, im.stuck = nil, nil
	im.mu.Unlock()
	var errs []error
	for _, m := range all {
		if m.timer != nil {
			m.timer.Stop()
		}
		if err := im.dropOne(m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// dropOne tears the kept mapping m down; on failure m goes to the stuck
// list.
func (im *Importer) dropOne(m *mapped) error {
	err := m.teardown(m.nmapped)
	if err != nil {
		err = fmt.Errorf("dropping the kept mapping of pid %d's block at %v: %w", m.desc.ExporterPID, m.base, err)
		im.mu.Lock()
		im.stuck = append(im.stuck, m)
		im.mu.Unlock()
	}
	return err
}

// keepable reports whether m, just mapped from fds, may be kept when its
// last Mapping closes: the importer keeps, the share is of posix fds and
// few allocations, and kcmp works here (tried once, on the first fd).
func (im *Importer) keepable(m *mapped, fds []*handles.FD) bool {
	if im.opts.KeepFor <= 0 || m.desc.Kind != handles.KindPosixFD || len(fds) == 0 || len(fds) > maxKeptAllocations {
		return false
	}
	im.mu.Lock()
	defer im.mu.Unlock()
	if !im.kcmpTried {
		im.kcmpTried = true
		same, err := handles.SameOpenFile(fds[0], fds[0])
		im.kcmpOK = err == nil && same
	}
	return im.kcmpOK
}

// takeKept returns the kept mapping of the same exporter, device, access,
// page size and spans whose fds are the same open files as fds, taken out
// of the kept list; nil if none is.
func (im *Importer) takeKept(d *handles.Descriptor, dev vmm.Device, access vmm.Access, fds []*handles.FD) *mapped {
	im.mu.Lock()
	defer im.mu.Unlock()
	for i, k := range im.kept {
		if k.desc.ExporterPID != d.ExporterPID || k.key.dev != dev || k.access != access ||
			k.desc.PageSize != d.PageSize || !slices.Equal(k.desc.Spans, d.Spans) || len(k.keepFDs) != len(fds) {
			continue
		}
		same := true
		for j := range fds {
			if ok, err := handles.SameOpenFile(k.keepFDs[j], fds[j]); err != nil || !ok {
				same = false
				break
			}
		}
		if !same {
			continue
		}
		im.kept = slices.Delete(im.kept, i, i+1)
		k.timer.Stop() // if it fired already, expire finds k gone
		return k
	}
	return nil
}

// adopt makes m, whose fds were fetched as r.FDs, the mapping kept as k:
// k's range, imported allocations and fds; r's fds are closed.
func (m *mapped) adopt(k *mapped, r *Received) error {
	m.base, m.pages, m.nmapped, m.reserved, m.keepFDs = k.base, k.pages, k.nmapped, k.reserved, k.keepFDs
	k.pages, k.nmapped, k.reserved, k.keepFDs = nil, 0, false, nil
	m.reused = true
	err := handles.CloseAll(r.FDs)
	r.FDs = nil
	return err
}

// keep puts m, whose last Mapping closed, in the kept list: its lease
// ends, its mapping stays for KeepFor. The oldest kept mappings past
// KeepMax are torn down; the error is theirs.
func (im *Importer) keep(m *mapped) error {
	m.leaseMu.Lock()
	err := m.recv.EndLease()
	m.leased = false
	m.leaseMu.Unlock()
	im.mu.Lock()
	im.kept = append(im.kept, m)
	m.timer = time.AfterFunc(im.opts.KeepFor, func() { im.expire(m) })
	var out []*mapped
	if n := len(im.kept) - im.opts.KeepMax; n > 0 {
		out = slices.Clone(im.kept[:n])
		im.kept = slices.Delete(im.kept, 0, n)
	}
	im.mu.Unlock()
	for _, o := range out {
		o.timer.Stop()
		err = errors.Join(err, im.dropOne(o))
	}
	return err
}

// expire tears down m when its KeepFor has passed, unless an Open took it
// or DropKept dropped it first.
func (im *Importer) expire(m *mapped) {
	im.mu.Lock()
	i := slices.Index(im.kept, m)
	if i >= 0 {
		im.kept = slices.Delete(im.kept, i, i+1)
	}
	im.mu.Unlock()
	if i < 0 {
		return
	}
	if err := im.dropOne(m); err != nil && im.opts.OnError != nil {
		im.opts.OnError(err)
	}
}
