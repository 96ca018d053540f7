package host

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// Defaults of Options.
const (
	// DefaultCapacity is the memory of one device: 141 GiB, an H200's.
	DefaultCapacity uint64 = 141 << 30
	// DefaultGranularity is the page size and alignment: 2 MiB, as on
	// NVIDIA GPUs.
	DefaultGranularity uint64 = 2 << 20
	// MaxCapacity is the most memory a device may have: 4 TiB, 1/32 of
	// the 128 TiB of address space that x86-64 gives a process. The
	// capacity costs no memory, but the expandable allocator reserves a
	// device's whole capacity as address space for each range of its
	// default stream: one a pool, and one a size class under size_classes
	// (a dozen or more). Replaying bench/traces/gpt2_train.trace.gz ran out
	// of address space (Reserve failing with ENOMEM at an allocation) at
	// 16 TiB with size_classes and at 60 TiB with policy:classic; every
	// trace there replays at 4 TiB with size_classes. Open refuses more.
	MaxCapacity uint64 = 4 << 40
)

// Options configure a host driver. The zero value is one device of
// DefaultCapacity with DefaultGranularity pages.
type Options struct {
	// Devices is the number of virtual devices (default 1).
	Devices int
	// Capacity is the memory of each device in bytes (default
	// DefaultCapacity, at most MaxCapacity). Create and MemAlloc fail with
	// vmm.ErrOutOfMemory beyond it. Memory is sparse: only bytes written
	// take RAM.
	Capacity uint64
	// Granularity is the page size and alignment, a power of two that is a
	// multiple of the OS page size (default DefaultGranularity).
	Granularity uint64
	// MaxMappings bounds the memory mappings the driver holds at once,
	// counting a reserved range and a plain allocation as one and a
	// mapped page as two (it may split its range's mapping in three).
	// Reserve, Map and MemAlloc fail with vmm.ErrOutOfMemory past it.
	// 0: three quarters of the process's limit, vm.max_map_count
	// (DefaultMaxMappings); -1: no bound. Past the kernel's limit every
	// mmap of the process fails, the Go runtime's own included, which
	// kills the process instead of failing an allocation.
	MaxMappings int
}

// Driver is the vmm.Driver contract on Linux host memory. It is safe for
// concurrent use by multiple goroutines.
type Driver struct {
	opts  Options
	books *ledger.Ledger
	uuids [][16]byte

	// life is held shared by every method for its whole run and
	// exclusively by Close, so that Close never pulls an fd from under a
	// running call.
	life   sync.RWMutex
	closed bool // guarded by life

	// prot orders the calls that change what is mapped or how (Map, Unmap,
	// SetAccess, MemFree hold it exclusively) against the copies that touch
	// mapped memory (they hold it shared from their check to the end of the
	// copy), so a copy never touches memory that lost its protection
	// after the check.
	prot sync.RWMutex

	mu struct {
		sync.Mutex
		nextHandle vmm.Handle
		nextStream vmm.Stream
		nextEvent  vmm.Event
		pages      map[vmm.Handle]*backing
		allocs     map[vmm.DevicePtr]allocation
		used       []uint64 // bytes of capacity taken, per device
		arenas     []*arena // per device
	}
}

var (
	_ vmm.Driver         = (*Driver)(nil)
	_ vmm.AllocFD        = (*Driver)(nil)
	_ vmm.AsyncMemsetter = (*Driver)(nil)
)

// backing is where a page's bytes live.
type backing struct {
	fd       int   // the arena's memfd, or the page's own
	offset   int64 // of the page in fd
	own      bool  // fd is this page's alone (HandlePosixFD or imported)
	imported bool  // made by ImportFD: takes no capacity, no arena extent
	dev      vmm.Device
	size     uint64
}

// allocation is a plain allocation made by MemAlloc.
type allocation struct {
	dev  vmm.Device
	size uint64 // mapped bytes: the request rounded up to the OS page
	// memfd holds the allocation's bytes once ExportAllocFD has moved
	// them there (-1 before: anonymous memory); fileSize is its length.
	memfd    int
	fileSize uint64
}

// Open makes a driver with the given options and the memfd arena of each
// device (one file descriptor a device, held until Close).
func Open(o Options) (*Driver, error) {
	if o.Devices == 0 {
		o.Devices = 1
	}
	if o.Capacity == 0 {
		o.Capacity = DefaultCapacity
	}
	if o.Granularity == 0 {
		o.Granularity = DefaultGranularity
	}
	if o.Devices < 0 {
		return nil, fmt.Errorf("host: %d devices: %w", o.Devices, vmm.ErrInvalid)
	}
	g := o.Granularity
	if g&(g-1) != 0 || g%osPage != 0 {
		return nil, fmt.Errorf("host: granularity %d is not a power of two multiple of the OS page size %d: %w", g, osPage, vmm.ErrInvalid)
	}
	if o.Capacity%g != 0 {
		return nil, fmt.Errorf("host: capacity %d is not a multiple of the granularity %d: %w", o.Capacity, g, vmm.ErrInvalid)
	}
	switch {
	case o.MaxMappings == 0:
		o.MaxMappings = DefaultMaxMappings()
	case o.MaxMappings < -1:
		return nil, fmt.Errorf("host: MaxMappings %d: want -1 (no bound), 0 (the default) or more: %w", o.MaxMappings, vmm.ErrInvalid)
	}
	if o.Capacity > MaxCapacity {
		return nil, fmt.Errorf("host: capacity %d is more than MaxCapacity %d (4 TiB): an allocator reserves a device's capacity "+
			"as address space once a range, and x86-64 gives a process 128 TiB: %w", o.Capacity, MaxCapacity, vmm.ErrInvalid)
	}
	d := &Driver{opts: o, books: ledger.New(g)}
	d.mu.pages = make(map[vmm.Handle]*backing)
	d.mu.allocs = make(map[vmm.DevicePtr]allocation)
	d.mu.used = make([]uint64, o.Devices)
	host := hostName()
	for i := range o.Devices {
		a, err := newArena(i, o.Capacity)
		if err != nil {
			return nil, errors.Join(err, d.closeFDs())
		}
		d.mu.arenas = append(d.mu.arenas, a)
		d.uuids = append(d.uuids, deviceUUID(host, i))
	}
	return d, nil
}

// deviceUUID derives the UUID of a device from the machine and the ordinal:
// every process on the machine sees the same UUID for the same device, as
// with a GPU, so an importer can tell which device an exported page is on.
func deviceUUID(host string, dev int) [16]byte {
	sum := sha256.Sum256(fmt.Appendf(nil, "xseg host device %d on %s", dev, host))
	var u [16]byte
	copy(u[:], sum[:])
	u[6] = u[6]&0x0f | 0x80 // RFC 9562 version 8: custom
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return u
}

// enter starts a method: it holds life shared, and fails with ErrClosed once
// the driver is closed. On success the caller must d.life.RUnlock().
func (d *Driver) enter() error {
	d.life.RLock()
	if d.closed {
		d.life.RUnlock()
		return fmt.Errorf("host driver: %w", vmm.ErrClosed)
	}
	return nil
}

// checkDevice reports ErrInvalid unless dev is a device of this driver.
func (d *Driver) checkDevice(dev vmm.Device) error {
	if dev < 0 || int(dev) >= d.opts.Devices {
		return fmt.Errorf("host: device %d of %d: %w", dev, d.opts.Devices, vmm.ErrInvalid)
	}
	return nil
}

// Backend returns "host".
func (d *Driver) Backend() string { return "host" }

// DriverVersion returns 0: there is no driver underneath.
func (d *Driver) DriverVersion() (int, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	return 0, nil
}

// DeviceCount returns Options.Devices.
func (d *Driver) DeviceCount() (int, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	return d.opts.Devices, nil
}

// DeviceInfo describes virtual device dev: VMM and POSIX-fd handles
// supported, fabric handles and RDMA not.
func (d *Driver) DeviceInfo(dev vmm.Device) (vmm.DeviceInfo, error) {
	if err := d.enter(); err != nil {
		return vmm.DeviceInfo{}, err
	}
	defer d.life.RUnlock()
	if err := d.checkDevice(dev); err != nil {
		return vmm.DeviceInfo{}, err
	}
	return vmm.DeviceInfo{
		Ordinal:                dev,
		Name:                   fmt.Sprintf("xseg host device %d", dev),
		UUID:                   d.uuids[dev],
		TotalMemory:            d.opts.Capacity,
		VMM:                    true,
		PosixFD:                true,
		Granularity:            d.opts.Granularity,
		RecommendedGranularity: d.opts.Granularity,
	}, nil
}

// MemInfo reports the capacity of dev and what of it is not taken by pages
// created (not imported) or plain allocations on dev.
func (d *Driver) MemInfo(dev vmm.Device) (free, total uint64, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer d.life.RUnlock()
	if err := d.checkDevice(dev); err != nil {
		return 0, 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.opts.Capacity - d.mu.used[dev], d.opts.Capacity, nil
}

// Usage reports what the driver has outstanding. It works after Close too.
func (d *Driver) Usage() vmm.Usage { return d.books.Usage() }

// Close closes the driver's file descriptors: the arenas and the memfds of
// the pages created with HandlePosixFD or imported. Mappings stay valid (a
// mapping keeps its file alive) and so do reservations and plain
// allocations; they are the caller's, and Usage still counts them, but no
// method of the driver works on them any more: every call after Close fails
// with vmm.ErrClosed. Close is idempotent.
func (d *Driver) Close() error {
	d.life.Lock()
	defer d.life.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	return d.closeFDs()
}

// closeFDs closes every fd the driver holds.
func (d *Driver) closeFDs() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for i, a := range d.mu.arenas {
		if err := closeFD(a.fd); err != nil {
			errs = append(errs, fmt.Errorf("closing the arena of device %d: %w", i, err))
		}
	}
	d.mu.arenas = nil
	for h, b := range d.mu.pages {
		if !b.own {
			continue
		}
		if err := closeFD(b.fd); err != nil {
			errs = append(errs, fmt.Errorf("closing the memfd of page %#x: %w", uint64(h), err))
		}
	}
	d.mu.pages = nil
	for p, a := range d.mu.allocs {
		if a.memfd < 0 {
			continue
		}
		if err := closeFD(a.memfd); err != nil {
			errs = append(errs, fmt.Errorf("closing the memfd of allocation %v: %w", p, err))
		}
		a.memfd = -1
		d.mu.allocs[p] = a
	}
	return errors.Join(errs...)
}

// DefaultMaxMappings is Options.MaxMappings's default: three quarters of
// the process's limit of memory mappings (/proc/sys/vm/max_map_count,
// 65,530 by default), the rest left to the process (its heap, libraries,
// threads); -1 (no bound) where the limit cannot be read.
func DefaultMaxMappings() int {
	n := maxMapCount()
	if n <= 0 {
		return -1
	}
	return max(1, n/4*3)
}

// roomForMappings fails with vmm.ErrOutOfMemory when n more mappings
// (Options.MaxMappings's count) would pass the bound.
func (d *Driver) roomForMappings(what string, n int) error {
	lim := d.opts.MaxMappings
	if lim < 0 {
		return nil
	}
	u := d.books.Usage()
	if have := u.Ranges + u.Allocs + 2*u.Mappings; have+n > lim {
		return fmt.Errorf("%s: the host backend holds %d memory mappings of its bound of %d (MaxMappings; the process may have vm.max_map_count in all): %w",
			what, have, lim, vmm.ErrOutOfMemory)
	}
	return nil
}
