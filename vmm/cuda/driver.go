package cuda

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

var (
	_ vmm.Driver         = (*Driver)(nil)
	_ vmm.AllocIPC       = (*Driver)(nil)
	_ vmm.AsyncMemsetter = (*Driver)(nil)
)

// Driver is the vmm.Driver of the CUDA driver API. It is safe for concurrent
// use by multiple goroutines, and by threads that entered Go through cgo
// with a CUDA context of their own current.
//
// Only Open makes a working Driver. The methods of one it did not make
// (the zero value; every Driver of a build without cgo or off Linux) fail
// with an error matching vmm.ErrNotSupported.
type Driver struct {
	sym     symbols // resolved once by Open; nil in a Driver not made by Open
	books   *ledger.Ledger
	count   int
	version int
	closed  atomic.Bool
	// devs[i] is device i once first used: its retained primary context
	// and the facts the hot paths need. Set once, under mu.
	devs []atomic.Pointer[device]
	mu   struct {
		sync.Mutex
		retained []*device // in the order retained, released by Close
	}
	// dead holds the streams this Driver destroyed, so that a later call
	// naming one is refused instead of handing the driver a dead handle
	// (streams made elsewhere are not in the books and pass through).
	dead struct {
		sync.Mutex
		streams map[vmm.Stream]struct{}
	}
}

// device is the state of one device in use by a Driver.
type device struct {
	ord     vmm.Device
	cu      cuDevice
	ctx     cuContext // primary context, retained by this Driver
	total   uint64
	vmm     bool
	posixFD bool
	fabric  bool
	rdma    bool
	// info is DeviceInfo's answer, read from the driver once: none of it
	// changes while the context is retained, and sharing asks for it on
	// every share and open.
	info atomic.Pointer[vmm.DeviceInfo]
}

var errClosed = fmt.Errorf("vmm/cuda: driver is closed: %w", vmm.ErrClosed)

// open makes the Driver of a resolved symbol table: it counts the devices,
// retains the primary context of device 0 (the fallback context of calls
// that may run in any) and reads its granularity for the books. See Open.
func open(sym symbols, version int) (*Driver, error) {
	d := &Driver{sym: sym, version: version}
	var err error
	if d.count, err = d.sym.deviceGetCount(); err != nil {
		return nil, fmt.Errorf("cuDeviceGetCount: %w", err)
	}
	if d.count == 0 {
		return nil, fmt.Errorf("vmm/cuda: the driver sees no device: %w", vmm.ErrNotSupported)
	}
	d.devs = make([]atomic.Pointer[device], d.count)
	dev0, err := d.device(0)
	if err != nil {
		return nil, err
	}
	d.sym.setFallback(dev0.ctx)
	gran := uint64(2 << 20)
	if dev0.vmm {
		if gran, err = d.sym.granularity(0, dev0.cu, false); err != nil {
			_ = d.Close()
			return nil, fmt.Errorf("cuMemGetAllocationGranularity of device 0: %w", err)
		}
		// The books need a power of two (ledger.New panics otherwise); a
		// driver that answers anything else is not one this package knows.
		if gran == 0 || gran&(gran-1) != 0 {
			_ = d.Close()
			return nil, fmt.Errorf("cuMemGetAllocationGranularity of device 0: %d bytes, not a power of two: %w", gran, vmm.ErrNotSupported)
		}
	}
	d.books = ledger.New(gran)
	return d, nil
}

// device returns the state of dev, retaining its primary context on first
// use.
func (d *Driver) device(dev vmm.Device) (*device, error) {
	if dev < 0 || int(dev) >= d.count {
		return nil, fmt.Errorf("device %d: the driver has %d devices: %w", dev, d.count, vmm.ErrInvalid)
	}
	if s := d.devs[dev].Load(); s != nil {
		return s, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, errClosed
	}
	if s := d.devs[dev].Load(); s != nil {
		return s, nil
	}
	s, err := d.probe(dev)
	if err != nil {
		return nil, err
	}
	if s.ctx, err = d.sym.primaryCtxRetain(s.cu); err != nil {
		return nil, fmt.Errorf("cuDevicePrimaryCtxRetain(%d): %w", dev, err)
	}
	if s.fabric && s.vmm {
		s.fabric = d.fabricWorks(s)
	}
	d.mu.retained = append(d.mu.retained, s)
	d.devs[dev].Store(s)
	return s, nil
}

// probe reads the facts of dev that the hot paths use.
func (d *Driver) probe(dev vmm.Device) (*device, error) {
	cu, err := d.sym.deviceGet(dev)
	if err != nil {
		return nil, fmt.Errorf("cuDeviceGet(%d): %w", dev, err)
	}
	s := &device{ord: dev, cu: cu}
	if s.total, err = d.sym.deviceTotalMem(cu); err != nil {
		return nil, fmt.Errorf("cuDeviceTotalMem(%d): %w", dev, err)
	}
	attrs := []struct {
		attr int
		dst  *bool
	}{
		{attrVMM, &s.vmm},
		{attrPosixFD, &s.posixFD},
		{attrFabric, &s.fabric},
		{attrRDMAWithVMM, &s.rdma},
	}
	for _, a := range attrs {
		v, err := d.sym.deviceGetAttribute(a.attr, cu)
		if err != nil {
			return nil, fmt.Errorf("cuDeviceGetAttribute(%d, %d): %w", a.attr, dev, err)
		}
		*a.dst = v != 0
	}
	return s, nil
}

// fabricWorks probes whether pages of s can be made exportable as fabric
// handles. The device attribute says the hardware can; the system may still
// forbid it (no IMEX channel: CUDA_ERROR_NOT_PERMITTED). Only an answer
// that matches vmm.ErrNotSupported counts as no; any other error is a
// "don't know" and leaves the attribute's yes.
func (d *Driver) fabricWorks(s *device) bool {
	g, err := d.sym.granularity(s.ctx, s.cu, false)
	if err != nil {
		return true
	}
	h, err := d.sym.memCreate(s.ctx, g, s.cu, vmm.HandleFabric, false)
	if err != nil {
		return !errors.Is(err, vmm.ErrNotSupported)
	}
	// A failed release would leave one probe page behind; the answer
	// stands either way, and Open has no caller to hand the page to.
	_ = d.sym.memRelease(s.ctx, h)
	return true
}

// live reports errClosed once the driver is closed, and errUnopened for a
// Driver that Open did not make.
func (d *Driver) live() error {
	if d.closed.Load() {
		return errClosed
	}
	if d.sym == nil {
		return errUnopened
	}
	return nil
}

// Backend returns "cuda".
func (d *Driver) Backend() string { return "cuda" }

// DriverVersion returns cuDriverGetVersion's answer, e.g. 13000 for 13.0.
func (d *Driver) DriverVersion() (int, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	return d.version, nil
}

// DeviceCount returns the number of devices the driver sees.
func (d *Driver) DeviceCount() (int, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	return d.count, nil
}

// DeviceInfo describes dev. It retains dev's primary context if no call
// has yet.
func (d *Driver) DeviceInfo(dev vmm.Device) (vmm.DeviceInfo, error) {
	if err := d.live(); err != nil {
		return vmm.DeviceInfo{}, err
	}
	s, err := d.device(dev)
	if err != nil {
		return vmm.DeviceInfo{}, err
	}
	if info := s.info.Load(); info != nil {
		return *info, nil
	}
	info := vmm.DeviceInfo{Ordinal: dev, TotalMemory: s.total, VMM: s.vmm,
		PosixFD: s.posixFD, Fabric: s.fabric, RDMAWithVMM: s.rdma}
	if info.Name, err = d.sym.deviceGetName(s.cu); err != nil {
		return vmm.DeviceInfo{}, fmt.Errorf("cuDeviceGetName(%d): %w", dev, err)
	}
	if info.UUID, err = d.sym.deviceGetUUID(s.cu); err != nil {
		return vmm.DeviceInfo{}, fmt.Errorf("cuDeviceGetUuid(%d): %w", dev, err)
	}
	if s.vmm {
		if info.Granularity, err = d.sym.granularity(s.ctx, s.cu, false); err != nil {
			return vmm.DeviceInfo{}, fmt.Errorf("cuMemGetAllocationGranularity(%d, minimum): %w", dev, err)
		}
		if info.RecommendedGranularity, err = d.sym.granularity(s.ctx, s.cu, true); err != nil {
			return vmm.DeviceInfo{}, fmt.Errorf("cuMemGetAllocationGranularity(%d, recommended): %w", dev, err)
		}
	}
	s.info.Store(&info)
	return info, nil
}

// MemInfo returns cuMemGetInfo's free and total bytes of dev, asked in
// dev's primary context.
func (d *Driver) MemInfo(dev vmm.Device) (free, total uint64, err error) {
	if err := d.live(); err != nil {
		return 0, 0, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, 0, err
	}
	if free, total, err = d.sym.memGetInfo(s.ctx); err != nil {
		return 0, 0, fmt.Errorf("cuMemGetInfo(%d): %w", dev, err)
	}
	return free, total, nil
}

// Usage reports what this driver has outstanding (see vmm.Usage). Imported
// pages count with an upper bound of their size (see ImportFD).
func (d *Driver) Usage() vmm.Usage {
	if d.books == nil {
		return vmm.Usage{}
	}
	return d.books.Usage()
}

// Close releases the primary contexts this driver retained. It does not
// free what the caller still holds (Usage says what). Later calls fail with
// vmm.ErrClosed; Close is idempotent. Close must not race with calls still
// in flight on the same Driver. The symbol table of libcuda, a few hundred
// bytes of C memory, is not freed, so that a call racing Close anyway
// cannot crash.
func (d *Driver) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var first error
	for _, s := range d.mu.retained {
		if err := d.sym.primaryCtxRelease(s.cu); err != nil && first == nil {
			first = fmt.Errorf("cuDevicePrimaryCtxRelease(%d): %w", s.ord, err)
		}
	}
	d.mu.retained = nil
	return first
}
