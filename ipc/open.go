package ipc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// OpenOptions tune Open. The zero value picks the transports automatically
// and grants the device read-write access.
type OpenOptions struct {
	// Fetch chooses the transports (see Fetch).
	Fetch FetchOptions
	// Access is what the device gets on the mapping (default
	// vmm.AccessReadWrite).
	Access vmm.Access
	// DeferLease returns the Mapping with the exporter's answer to the
	// lease request not yet read: the caller may prepare what it needs
	// (a tensor over Ptr) meanwhile, and must call Mapping.AwaitLease,
	// and see it succeed, before any byte is read or written. Otherwise
	// Open waits for the lease itself. An Open that claims a share made
	// for one importer (Mapping.Claimed) has no answer to wait for, with
	// or without DeferLease.
	DeferLease bool
}

// A Mapping is one Open of a shared block: the block's bytes at an address
// of this process. Opens of the same descriptor (same exporter pid and
// token) through the same Importer, on the same device and with the same
// access (OpenOptions.Access) share one mapping, counted by reference:
// each Open returns its own Mapping, and the shared mapping is unmapped
// when the last of them closes. A mapping stays valid after the exporter
// exits.
//
// A Mapping is safe for concurrent use.
type Mapping struct {
	m  *mapped
	mu sync.Mutex
	// dropped: Close dropped this reference; owed: it was the last, and
	// the teardown has not yet succeeded.
	dropped, owed bool
}

// Ptr is the address of the shared block in this process: the mapped
// extent's start plus the block's offset in its first allocation.
func (m *Mapping) Ptr() vmm.DevicePtr { return m.m.base.Add(m.m.desc.Offset) }

// Len is the length of the shared block in bytes.
func (m *Mapping) Len() uint64 { return m.m.desc.Length }

// Via is the transport that brought the pages.
func (m *Mapping) Via() Transport { return m.m.via }

// Allocations is how many of the exporter's allocations the block spans
// (each imported and mapped on its own).
func (m *Mapping) Allocations() int { return m.m.desc.PageCount }

// Leased reports whether the mapping holds a lease on the exporter's share
// (see Received.Leased).
func (m *Mapping) Leased() bool {
	m.m.leaseMu.Lock()
	defer m.m.leaseMu.Unlock()
	return m.m.leased
}

// OpenStages are the times the steps of the Open that made a mapping
// took, for finding where an open's time goes: Fetch (the fds, or the
// fabric handles, and the lease asked for), Reserve, Import (every
// allocation imported), Map (mapped, and access set), Lease (the fetched
// fds closed, and the wait for the lease's answer that the steps before
// did not cover). Zero for a cuda-ipc descriptor's.
type OpenStages struct {
	Fetch, Reserve, Import, Map, Lease time.Duration
}

// Claimed reports whether the Open won the claim of a share made for one
// importer (Exporter.ShareBlockOnce): it did not wait for the exporter's
// answer, which holds the pages for it alone.
func (m *Mapping) Claimed() bool { return m.m.claimed }

// Reused reports whether the Open took over a kept mapping of the same
// allocations (ImporterOptions.KeepFor) instead of mapping them again.
func (m *Mapping) Reused() bool { return m.m.reused }

// Stages are the times of the steps of the Open that made the mapping
// (shared by every Mapping of it, see Mapping).
func (m *Mapping) Stages() OpenStages {
	m.m.leaseMu.Lock() // AwaitLease adds to Lease
	defer m.m.leaseMu.Unlock()
	return m.m.stages
}

// Close drops this reference. The last one unmaps the pages, releases
// them, gives back the address range and ends the lease; under
// ImporterOptions.KeepFor it ends the lease and keeps the rest for a later
// share of the same allocations (keep.go), returning the errors of older
// kept mappings it tore down to make room. If the driver
// fails, Close returns the error and keeps what it could not give back; a
// later Close of the same Mapping tries again, and returns nil once
// nothing is held. Other Closes return nil. Using Ptr's memory after
// Close is the caller's bug.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dropped {
		m.dropped, m.owed = true, m.m.unref()
		if m.owed && m.m.keepFDs != nil {
			m.owed = false
			return m.m.im.keep(m.m)
		}
	}
	if !m.owed {
		return nil
	}
	if err := m.m.teardown(m.m.nmapped); err != nil {
		return fmt.Errorf("closing the mapping of pid %d's block at %v: %w", m.m.desc.ExporterPID, m.m.base, err)
	}
	m.owed = false
	return nil
}

// mapped is the one mapping of a descriptor in an Importer.
type mapped struct {
	im    *Importer
	key   mapKey
	drv   vmm.Driver
	desc  *handles.Descriptor
	base  vmm.DevicePtr
	pages []vmm.Handle // imported, one per allocation in order; 0 where released or not imported
	// nmapped counts the allocations mapped from base (desc.Spans pages
	// each), reserved whether base is still reserved: what a teardown has
	// left to undo.
	nmapped  int
	reserved bool
	recv     *Received // holds the lease
	ipc      *ipcOpen  // the allocation opened, for a cuda-ipc descriptor
	via      Transport
	leased   bool
	stages   OpenStages    // written by open, read after ready
	ready    chan struct{} // closed when Open's work ended
	err      error         // of that work, read after ready
	refs     int           // guarded by im.mu
	// access is what the device was granted; keepFDs, under
	// ImporterOptions.KeepFor, this process's copy of each allocation's
	// fd, held while mapped so that a later share of the same files finds
	// the mapping once kept (keep.go); reused, that this Open took a kept
	// mapping over; timer ends it while kept.
	access  vmm.Access
	keepFDs []*handles.FD
	reused  bool
	claimed bool
	timer   *time.Timer
	// deferLease: open left the lease's answer unread (OpenOptions.
	// DeferLease); leaseMu guards leaseDone and leaseErr, the outcome of
	// reading it (AwaitLease).
	deferLease bool
	leaseMu    sync.Mutex
	leaseDone  bool
	leaseErr   error
}

// AwaitLease waits for the exporter's answer to the lease request of an
// Open made with OpenOptions.DeferLease; nil at once for any other, for
// one that claimed its share (Claimed), and for every call after the
// first success. An error (the exporter refused:
// the share closed before the request reached it) means the pages are not
// protected: read nothing, and Close the Mapping. Safe for concurrent use.
func (m *Mapping) AwaitLease() error {
	mp := m.m
	mp.leaseMu.Lock()
	defer mp.leaseMu.Unlock()
	if !mp.leaseDone && mp.recv == nil {
		// Torn down (the last Close) before anyone asked: nothing holds
		// the pages any more.
		return fmt.Errorf("awaiting the lease of a closed mapping: %w", vmm.ErrClosed)
	}
	if !mp.leaseDone {
		t0 := time.Now()
		// Open's ctx is over: the deadline the lease request was
		// sent with bounds the wait.
		mp.leaseErr = mp.recv.awaitLease(context.Background())
		mp.leased = mp.recv.Leased()
		mp.stages.Lease += time.Since(t0)
		mp.leaseDone = true
		if mp.leaseErr != nil {
			mp.leaseErr = fmt.Errorf("taking the lease on pid %d's share: %w", mp.desc.ExporterPID, mp.leaseErr)
		}
	}
	return mp.leaseErr
}

// mapKey names a mapping in its Importer: the descriptor's exporter and
// token, the device it is mapped for and the access that device has (a
// read-only Open must not share a writable mapping, nor the reverse).
type mapKey struct {
	pid    int
	token  handles.Token
	dev    vmm.Device
	access vmm.Access
}

// mapAccess is the access an Open with opts gives the device: read-write
// unless opts asks for another, and always read-write for a cuda-ipc
// descriptor (legacy IPC has no other mode).
func mapAccess(d *handles.Descriptor, opts OpenOptions) vmm.Access {
	if opts.Access == vmm.AccessNone || d.Kind == handles.KindCUDAIPC {
		return vmm.AccessReadWrite
	}
	return opts.Access
}

// An Importer opens shared blocks into this process on one driver, and
// keeps what Opens through it share: one mapping of each descriptor and
// device, counted by reference (see Mapping), and, for cuda-ipc
// descriptors, one vmm.Driver.OpenAllocIPC of each handle and device,
// which CUDA allows once per process. The importer is the state a process
// keeps for its driver: hold one per driver (cmd/libxseg holds one for
// its driver) and open everything through it. Two Importers on one driver
// share nothing: each maps the blocks opened through it, and the second
// OpenAllocIPC of a cuda-ipc handle fails on CUDA.
//
// An Importer made with NewImporter needs no closing: it holds only its
// live Mappings, each closed by its own Close. One made with
// NewImporterWith and KeepFor also holds the mappings it keeps (keep.go)
// until they expire or DropKept. It is safe for concurrent use.
type Importer struct {
	drv vmm.Driver
	mu  sync.Mutex // guards maps and the refs of every mapping in it
	// maps are the live mappings (and those an Open is still making).
	maps map[mapKey]*mapped
	// ipcMu guards opens, and is held across the driver's open and close
	// of a handle: they are rare, and it keeps an open from racing the
	// close of the same handle.
	ipcMu sync.Mutex
	opens map[ipcKey]*ipcOpen

	// opts: NewImporterWith's (keep.go); kept are the kept mappings,
	// oldest first, and stuck those whose teardown failed; kcmpTried and
	// kcmpOK whether kcmp was tried here and works. Guarded by mu.
	opts              ImporterOptions
	kept, stuck       []*mapped
	kcmpTried, kcmpOK bool
}

// NewImporter returns an Importer that opens shared blocks on drv. It
// does not close drv.
func NewImporter(drv vmm.Driver) *Importer {
	return &Importer{drv: drv, maps: map[mapKey]*mapped{}, opens: map[ipcKey]*ipcOpen{}}
}

// Driver is the driver the importer opens blocks on.
func (im *Importer) Driver() vmm.Driver { return im.drv }

// Open maps the block that desc (a descriptor's wire form, untrusted)
// names into this process for device dev of the importer's driver: it
// refuses a shared extent larger than dev's memory (vmm.ErrInvalid),
// fetches the pages (Fetch, with opts.Fetch), reserves exactly the shared
// extent (Descriptor.Bytes: the pages of every allocation times page
// size), imports each allocation (ImportFD, or ImportFabric for a fabric
// descriptor), maps each whole (its span of pages) in order, and grants
// dev access to the run with one SetAccess. The fetched fds are closed
// once the pages are mapped: the imported handles keep the pages. On any
// failure everything done is undone and the error says which step failed.
//
// A descriptor already open through im for dev with the same access is
// not fetched again: the new Mapping shares the mapping (see Mapping),
// also after its exporter has exited.
//
// A cuda-ipc descriptor (a block of the fallback allocator on CUDA) is
// opened with vmm.Driver.OpenAllocIPC instead, once per handle in the
// importer however many descriptors name it, read-write, and closed with
// CloseAllocIPC after the last Mapping of it closes. Opening one in the
// process that exported it fails with ErrOwnIPCHandle.
//
// Open is safe for concurrent use; concurrent Opens of one descriptor wait
// for one mapping. ctx bounds the socket exchange.
func (im *Importer) Open(ctx context.Context, desc []byte, dev vmm.Device, opts OpenOptions) (*Mapping, error) {
	d, err := handles.ParseDescriptor(desc)
	if err == nil {
		err = checkFits(im.drv, dev, d)
	}
	if err != nil {
		return nil, fmt.Errorf("opening a shared block: %w", err)
	}
	key := mapKey{d.ExporterPID, d.Token, dev, mapAccess(d, opts)}
	im.mu.Lock()
	if old := im.maps[key]; old != nil {
		old.refs++
		im.mu.Unlock()
		<-old.ready
		if old.err != nil {
			return nil, old.err
		}
		mp := &Mapping{m: old}
		if !opts.DeferLease {
			if err := mp.AwaitLease(); err != nil {
				return nil, errors.Join(err, mp.Close())
			}
		}
		return mp, nil
	}
	m := &mapped{im: im, key: key, drv: im.drv, desc: d, ready: make(chan struct{}), refs: 1, deferLease: opts.DeferLease}
	im.maps[key] = m
	im.mu.Unlock()
	m.err = m.open(ctx, dev, opts)
	if m.err != nil {
		m.err = fmt.Errorf("opening %d-byte block of pid %d: %w", d.Length, d.ExporterPID, m.err)
		m.forget()
	}
	close(m.ready)
	if m.err != nil {
		return nil, m.err
	}
	return &Mapping{m: m}, nil
}

// Open opens desc for device dev of drv through an Importer of its own
// (NewImporter(drv).Open): see Importer.Open. Its mapping is shared with
// no other Open, and on CUDA a cuda-ipc descriptor whose handle this
// process already has open fails. A process that opens a block more than
// once, or several blocks of one fallback segment, opens them through one
// Importer.
func Open(ctx context.Context, desc []byte, drv vmm.Driver, dev vmm.Device, opts OpenOptions) (*Mapping, error) {
	return NewImporter(drv).Open(ctx, desc, dev, opts)
}

// forget takes a failed mapping out of its importer; Opens that waited
// for it return its error.
func (m *mapped) forget() {
	m.im.mu.Lock()
	delete(m.im.maps, m.key)
	m.im.mu.Unlock()
}

// unref drops one reference and reports whether it was the last: the
// caller then tears the mapping down. A new Open of the descriptor makes
// a mapping of its own.
func (m *mapped) unref() bool {
	m.im.mu.Lock()
	defer m.im.mu.Unlock()
	m.refs--
	last := m.refs == 0
	if last {
		delete(m.im.maps, m.key)
	}
	return last
}
