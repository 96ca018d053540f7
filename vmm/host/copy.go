package host

import (
	"fmt"
	"math"

	"github.com/xseg-dev/xseg/vmm"
)

// Copies and memset touch mapped memory from Go. Touching memory without the
// protection the access needs kills the process with SIGSEGV, so each first
// checks, under d.prot held shared, that every byte is either in a plain
// allocation or in mappings whose protection allows the access, and answers
// vmm.ErrInvalid otherwise. Copies are synchronous.

// checkTouch reports ErrInvalid unless [ptr, ptr+n) lies in one plain
// allocation or in mappings readable (write false) or writable (write true)
// by the host. d.prot is held.
func (d *Driver) checkTouch(ptr vmm.DevicePtr, n uint64, write bool) error {
	end := ptr.Add(n)
	if end < ptr || n > math.MaxInt {
		return fmt.Errorf("%d bytes at %v: too many: %w", n, ptr, vmm.ErrInvalid)
	}
	if base, size, ok := d.books.AllocAt(ptr); ok {
		if end > base.Add(size) {
			return fmt.Errorf("%d bytes at %v: past the end of the allocation %v+%d: %w", n, ptr, base, size, vmm.ErrInvalid)
		}
		return nil
	}
	want := protRead
	if write {
		want |= protWrite
	}
	for p := ptr; p < end; {
		m, ok := d.books.Lookup(p)
		if !ok {
			return fmt.Errorf("%d bytes at %v: %v is not mapped: %w", n, ptr, p, vmm.ErrInvalid)
		}
		if protOf(m.Access)&want != want {
			return fmt.Errorf("%d bytes at %v: the mapping at %v is not %s: %w", n, ptr, m.Ptr, accessWord(write), vmm.ErrInvalid)
		}
		p = m.Ptr.Add(m.Size)
	}
	return nil
}

func accessWord(write bool) string {
	if write {
		return "writable"
	}
	return "readable"
}

// CopyHtoD copies src to dst, which must be writable.
func (d *Driver) CopyHtoD(dst vmm.DevicePtr, src []byte) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.prot.RLock()
	defer d.prot.RUnlock()
	if err := d.checkTouch(dst, uint64(len(src)), true); err != nil {
		return fmt.Errorf("copying to the device: %w", err)
	}
	copy(hostBytes(dst, uint64(len(src))), src)
	return nil
}

// CopyDtoH copies len(dst) bytes from src, which must be readable.
func (d *Driver) CopyDtoH(dst []byte, src vmm.DevicePtr) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.prot.RLock()
	defer d.prot.RUnlock()
	if err := d.checkTouch(src, uint64(len(dst)), false); err != nil {
		return fmt.Errorf("copying from the device: %w", err)
	}
	copy(dst, hostBytes(src, uint64(len(dst))))
	return nil
}

// CopyDtoD copies n bytes from src (readable) to dst (writable); the two may
// overlap. One device must be allowed to read src and write dst (see
// GetAccess): between two devices' memory that takes peer access.
func (d *Driver) CopyDtoD(dst, src vmm.DevicePtr, n uint64) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.prot.RLock()
	defer d.prot.RUnlock()
	if err := d.checkTouch(src, n, false); err != nil {
		return fmt.Errorf("copying between device addresses: source: %w", err)
	}
	if err := d.checkTouch(dst, n, true); err != nil {
		return fmt.Errorf("copying between device addresses: destination: %w", err)
	}
	if err := d.workDevice(fmt.Sprintf("copying %d bytes from %v to %v", n, src, dst),
		span{Ptr: dst, N: n, Want: vmm.AccessReadWrite}, span{Ptr: src, N: n, Want: vmm.AccessRead}); err != nil {
		return err
	}
	copy(hostBytes(dst, n), hostBytes(src, n))
	return nil
}

// Memset sets n bytes at dst, which must be writable, to value.
func (d *Driver) Memset(dst vmm.DevicePtr, value byte, n uint64) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	return d.memset(dst, value, n, -1)
}

// MemsetAsync is Memset queued on live stream s; host streams are
// synchronous, so it is done when it returns. On a stream made by
// StreamCreate, the stream's device must be allowed to write dst.
func (d *Driver) MemsetAsync(dst vmm.DevicePtr, value byte, n uint64, s vmm.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	dev := vmm.Device(-1)
	if s != 0 {
		var err error
		if dev, err = d.books.StreamDevice(s); err != nil {
			return fmt.Errorf("setting memory on a stream: %w", err)
		}
	}
	return d.memset(dst, value, n, dev)
}

// memset is Memset after enter. A device dev >= 0 (a stream's) must be
// allowed to write dst.
func (d *Driver) memset(dst vmm.DevicePtr, value byte, n uint64, dev vmm.Device) error {
	d.prot.RLock()
	defer d.prot.RUnlock()
	if err := d.checkTouch(dst, n, true); err != nil {
		return fmt.Errorf("setting memory: %w", err)
	}
	if dev >= 0 {
		if err := d.books.May(dev, span{Ptr: dst, N: n, Want: vmm.AccessReadWrite}); err != nil {
			return fmt.Errorf("setting memory on a stream of device %d: %w", dev, err)
		}
	}
	b := hostBytes(dst, n)
	if value == 0 || len(b) == 0 {
		clear(b)
		return nil
	}
	b[0] = value
	for i := 1; i < len(b); i *= 2 {
		copy(b[i:], b[:i])
	}
	return nil
}

// MemAlloc makes a plain allocation of size bytes on dev: an anonymous
// read-write mapping, rounded up to the OS page, counted against the
// device's capacity.
func (d *Driver) MemAlloc(dev vmm.Device, size uint64) (vmm.DevicePtr, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	if err := d.checkDevice(dev); err != nil {
		return 0, fmt.Errorf("allocating: %w", err)
	}
	if size == 0 {
		return 0, fmt.Errorf("allocating %d bytes: %w", size, vmm.ErrInvalid)
	}
	if size > d.opts.Capacity {
		// Before rounding up, which overflows near the top of the range.
		return 0, fmt.Errorf("allocating %d bytes on device %d of %d: %w", size, dev, d.opts.Capacity, vmm.ErrOutOfMemory)
	}
	if err := d.roomForMappings(fmt.Sprintf("allocating %d bytes", size), 1); err != nil {
		return 0, err
	}
	mapped, _ := roundUp(size, osPage) // no overflow: size <= MaxCapacity
	d.mu.Lock()
	err := d.take(dev, mapped)
	d.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("allocating %d bytes: %w", size, err)
	}
	addr, err := mapAnonymous(mapped)
	if err != nil {
		d.untake(dev, mapped)
		return 0, fmt.Errorf("allocating %d bytes: %w", size, sysErr(err))
	}
	ptr := vmm.DevicePtr(addr)
	d.mu.Lock()
	d.mu.allocs[ptr] = allocation{dev: dev, size: mapped, memfd: -1}
	d.mu.Unlock()
	d.books.AddAlloc(ptr, size)
	return ptr, nil
}

// MemFree frees an allocation made by MemAlloc (ErrInvalid for any other
// pointer), and closes its memfd if ExportAllocFD made one (importers keep
// their own references to the file). If munmap fails the allocation stays
// live.
func (d *Driver) MemFree(ptr vmm.DevicePtr) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	d.prot.Lock()
	defer d.prot.Unlock()
	size, err := d.books.BeginFreeAlloc(ptr)
	if err != nil {
		return err
	}
	d.mu.Lock()
	a := d.mu.allocs[ptr]
	d.mu.Unlock()
	if err := munmap(uintptr(ptr), a.size); err != nil {
		d.books.AddAlloc(ptr, size)
		return fmt.Errorf("freeing %v: %w", ptr, sysErr(err))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.mu.allocs, ptr)
	d.mu.used[a.dev] -= a.size
	if a.memfd >= 0 {
		if err := closeFD(a.memfd); err != nil {
			return fmt.Errorf("freeing %v: closing its memfd: %w", ptr, err)
		}
	}
	return nil
}
