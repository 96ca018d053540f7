package host

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/xseg-dev/xseg/vmm"
)

// memfdPrefix starts the name of the memfd of an exportable page; the device
// ordinal follows, so that an importer (/proc/self/fd/N reads
// "/memfd:xseg-host-dev3 (deleted)") knows the page's device.
const memfdPrefix = "xseg-host-dev"

// Create makes a physical page of size bytes on dev. Without
// vmm.HandlePosixFD it is an extent of the device's arena (no new fd); with
// it, a memfd of its own. Fabric handles are vmm.ErrNotSupported. Beyond the
// device's capacity it fails with vmm.ErrOutOfMemory. On failure nothing is
// taken.
func (d *Driver) Create(dev vmm.Device, size uint64, types vmm.HandleType) (vmm.Handle, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	if err := d.checkDevice(dev); err != nil {
		return 0, fmt.Errorf("creating a page: %w", err)
	}
	if err := d.books.CheckSize("creating a page", size); err != nil {
		return 0, err
	}
	if types&^(vmm.HandlePosixFD|vmm.HandleFabric) != 0 {
		return 0, fmt.Errorf("creating a page: handle types %v: %w", types, vmm.ErrInvalid)
	}
	if types&vmm.HandleFabric != 0 {
		return 0, fmt.Errorf("creating a page with fabric handles: the host backend has no fabric: %w", vmm.ErrNotSupported)
	}
	var b *backing
	var err error
	if types&vmm.HandlePosixFD != 0 {
		b, err = d.createOwn(dev, size)
	} else {
		b, err = d.createInArena(dev, size)
	}
	if err != nil {
		return 0, err
	}
	h := d.addPage(b)
	d.books.AddPage(h, dev, size, types)
	return h, nil
}

// take counts size bytes against the capacity of dev; d.mu is held.
func (d *Driver) take(dev vmm.Device, size uint64) error {
	if free := d.opts.Capacity - d.mu.used[dev]; size > free {
		return fmt.Errorf("device %d: %d bytes asked, %d of %d free: %w", dev, size, free, d.opts.Capacity, vmm.ErrOutOfMemory)
	}
	d.mu.used[dev] += size
	return nil
}

// untake gives back what take counted.
func (d *Driver) untake(dev vmm.Device, size uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.used[dev] -= size
}

// createInArena takes an extent of the arena of dev.
func (d *Driver) createInArena(dev vmm.Device, size uint64) (*backing, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.take(dev, size); err != nil {
		return nil, fmt.Errorf("creating a page of %d bytes: %w", size, err)
	}
	a := d.mu.arenas[dev]
	off, err := a.alloc(size)
	if err != nil {
		d.mu.used[dev] -= size
		return nil, fmt.Errorf("creating a page of %d bytes on device %d: %w", size, dev, err)
	}
	return &backing{fd: a.fd, offset: int64(off), dev: dev, size: size}, nil
}

// createOwn makes a memfd of size bytes for an exportable page.
func (d *Driver) createOwn(dev vmm.Device, size uint64) (*backing, error) {
	d.mu.Lock()
	err := d.take(dev, size)
	d.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("creating an exportable page of %d bytes: %w", size, err)
	}
	fd, err := createSealable(memfdPrefix + strconv.Itoa(int(dev)))
	if err != nil {
		d.untake(dev, size)
		return nil, fmt.Errorf("creating an exportable page of %d bytes: memfd_create: %w", size, sysErr(err))
	}
	if err := sizeAndSeal(fd, size); err != nil {
		d.untake(dev, size)
		return nil, fmt.Errorf("making an exportable page of %d bytes: %w (closing it: %v)", size, err, closeFD(fd))
	}
	return &backing{fd: fd, own: true, dev: dev, size: size}, nil
}

// addPage names a new page.
func (d *Driver) addPage(b *backing) vmm.Handle {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.nextHandle++
	d.mu.pages[d.mu.nextHandle] = b
	return d.mu.nextHandle
}

// Release destroys page h, which may not be mapped (ErrInUse). An arena page
// has its bytes punched out of the arena (if that fails the page stays
// live) and its extent and capacity given back; a page of its own has its
// memfd closed (close always frees the fd, so the page is gone even if close
// reports an error).
func (d *Driver) Release(h vmm.Handle) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	p, err := d.books.BeginRelease(h)
	if err != nil {
		return err
	}
	d.mu.Lock()
	b := d.mu.pages[h]
	d.mu.Unlock()
	if !b.own {
		if err := punch(b.fd, uint64(b.offset), b.size); err != nil {
			d.books.UndoRelease(p)
			return fmt.Errorf("releasing page %#x: punching [%d, +%d) out of the arena: %w", uint64(h), b.offset, b.size, sysErr(err))
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.mu.pages, h)
	if !b.imported {
		d.mu.used[b.dev] -= b.size
	}
	if !b.own {
		d.mu.arenas[b.dev].free.give(uint64(b.offset), b.size)
		return nil
	}
	if err := closeFD(b.fd); err != nil {
		return fmt.Errorf("releasing page %#x: closing its memfd: %w", uint64(h), err)
	}
	return nil
}

// ExportFD returns a new fd (close-on-exec, the caller's) of the memfd of
// page h, which must have been created with vmm.HandlePosixFD (else
// ErrInvalid) or imported.
func (d *Driver) ExportFD(h vmm.Handle) (int, error) {
	if err := d.enter(); err != nil {
		return -1, err
	}
	defer d.life.RUnlock()
	p, err := d.books.Page(h)
	if err != nil {
		return -1, fmt.Errorf("exporting: %w", err)
	}
	if p.Types&vmm.HandlePosixFD == 0 {
		return -1, fmt.Errorf("exporting page %#x: created without vmm.HandlePosixFD: %w", uint64(h), vmm.ErrInvalid)
	}
	// Under mu, so that a Release racing with us cannot close the fd
	// between the lookup and the dup.
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.mu.pages[h]
	if !ok || !b.own {
		return -1, fmt.Errorf("exporting page %#x: not a live exportable page: %w", uint64(h), vmm.ErrInvalid)
	}
	fd, err := dupFD(b.fd)
	if err != nil {
		return -1, fmt.Errorf("exporting page %#x: dup: %w", uint64(h), sysErr(err))
	}
	return fd, nil
}

// ImportFD makes a page of the memfd that fd names, perhaps exported by
// another process. The file must be sealed against shrinking and growing,
// as every memfd this backend exports is (see seal.go), else ErrInvalid:
// an unsealed file could be truncated under the mapping by anyone holding
// it. Its size is the file's, which must be a positive multiple of the
// granularity; its device is the one the exporter's memfd name says (0 if
// it says none this driver has). The fd is not consumed: the page holds a
// duplicate. Imported pages take no capacity.
func (d *Driver) ImportFD(fd int) (vmm.Handle, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	size, err := regularFileSize(fd)
	if err != nil {
		return 0, fmt.Errorf("importing fd %d: %w", fd, err)
	}
	if err := checkSealed(fd); err != nil {
		return 0, fmt.Errorf("importing fd %d: %w", fd, err)
	}
	if err := d.books.CheckSize("importing fd "+strconv.Itoa(fd)+": page", uint64(size)); err != nil {
		return 0, err
	}
	dup, err := dupFD(fd)
	if err != nil {
		return 0, fmt.Errorf("importing fd %d: dup: %w", fd, sysErr(err))
	}
	dev := d.memfdDevice(dup)
	h := d.addPage(&backing{fd: dup, own: true, imported: true, dev: dev, size: uint64(size)})
	d.books.AddPage(h, dev, uint64(size), vmm.HandlePosixFD)
	return h, nil
}

// memfdDevice reads the device of an exportable page from its memfd's name,
// 0 if the name says none of this driver's devices.
func (d *Driver) memfdDevice(fd int) vmm.Device {
	name, err := fdName(fd)
	if err != nil {
		return 0
	}
	dev, ok := parseMemfdDevice(name)
	if !ok || d.checkDevice(dev) != nil {
		return 0
	}
	return dev
}

// parseMemfdDevice parses the device out of a link such as
// "/memfd:xseg-host-dev3 (deleted)".
func parseMemfdDevice(link string) (vmm.Device, bool) {
	rest, ok := strings.CutPrefix(link, "/memfd:"+memfdPrefix)
	if !ok {
		return 0, false
	}
	digits, _, _ := strings.Cut(rest, " ")
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 {
		return 0, false
	}
	return vmm.Device(n), true
}

// ExportFabric is vmm.ErrNotSupported for a live page: the host backend
// has no fabric. A handle that is not live is vmm.ErrInvalid, as on CUDA.
func (d *Driver) ExportFabric(h vmm.Handle) (vmm.FabricHandle, error) {
	if err := d.enter(); err != nil {
		return vmm.FabricHandle{}, err
	}
	defer d.life.RUnlock()
	if _, err := d.books.Page(h); err != nil {
		return vmm.FabricHandle{}, fmt.Errorf("exporting as a fabric handle: %w", err)
	}
	return vmm.FabricHandle{}, fmt.Errorf("exporting page %#x as a fabric handle: %w", uint64(h), vmm.ErrNotSupported)
}

// ImportFabric is vmm.ErrNotSupported: the host backend has no fabric.
func (d *Driver) ImportFabric(vmm.FabricHandle) (vmm.Handle, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	return 0, fmt.Errorf("importing a fabric handle: %w", vmm.ErrNotSupported)
}
