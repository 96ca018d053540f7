package cuda

import (
	"encoding/binary"

	"github.com/xseg-dev/xseg/vmm"
)

// The VMM entry points of fakeCUDA: reservations, pages, mappings, access
// and the sharing of pages.

func (f *fakeCUDA) memAddressReserve(c cuContext, size, align uint64) (vmm.DevicePtr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memAddressReserve", c); err != nil {
		return 0, err
	}
	if size == 0 || size%f.gran != 0 || align&(align-1) != 0 {
		return 0, ErrorInvalidValue
	}
	if size > 1<<48 {
		return 0, ErrorOutOfMemory
	}
	p := f.mu.nextAddr.Add(align - 1)
	p -= vmm.DevicePtr(uint64(p) % max(align, 1))
	f.mu.nextAddr = p.Add(size + f.gran) // a guard granule between ranges
	f.mu.ranges[p] = size
	return p, nil
}

func (f *fakeCUDA) memAddressFree(c cuContext, ptr vmm.DevicePtr, size uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memAddressFree", c); err != nil {
		return err
	}
	if f.mu.ranges[ptr] != size {
		return ErrorInvalidValue
	}
	for _, m := range f.mu.maps {
		if m.ptr >= ptr && m.ptr < ptr.Add(size) {
			return ErrorInvalidValue
		}
	}
	delete(f.mu.ranges, ptr)
	return nil
}

func (f *fakeCUDA) memCreate(c cuContext, size uint64, d cuDevice, types vmm.HandleType, rdma bool) (vmm.Handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memCreate", c); err != nil {
		return 0, err
	}
	dev, err := f.device(d)
	switch {
	case err != nil:
		return 0, err
	case size == 0 || size%f.gran != 0 || types&^(vmm.HandlePosixFD|vmm.HandleFabric) != 0:
		return 0, ErrorInvalidValue
	case rdma && dev.attrs[attrRDMAWithVMM] == 0:
		return 0, ErrorNotSupported
	case types&vmm.HandleFabric != 0 && dev.fabricE != 0:
		return 0, dev.fabricE
	case dev.total-dev.used < size:
		return 0, ErrorOutOfMemory
	}
	dev.used += size
	h := vmm.Handle(0xa000_0000 + f.id())
	f.mu.pages[h] = &fakePage{&fakeMem{dev: int(d), size: size, types: types, owned: true}}
	return h, nil
}

func (f *fakeCUDA) memRelease(c cuContext, h vmm.Handle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memRelease", c); err != nil {
		return err
	}
	p, ok := f.mu.pages[h]
	if !ok {
		return ErrorInvalidValue
	}
	delete(f.mu.pages, h)
	if p.mem.owned {
		// The fake frees the bytes at once, where CUDA waits for the
		// last mapping: the Driver never releases a mapped page.
		f.devs[p.mem.dev].used -= p.mem.size
		p.mem.owned = false
	}
	return nil
}

func (f *fakeCUDA) memMap(c cuContext, ptr vmm.DevicePtr, size, offset uint64, h vmm.Handle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memMap", c); err != nil {
		return err
	}
	p, ok := f.mu.pages[h]
	switch {
	case !ok || size == 0 || offset+size > p.mem.size:
		return ErrorInvalidValue
	case offset != 0 || size != p.mem.size:
		return ErrorNotSupported // whole pages only
	case !f.reserved(ptr, size) || f.mapped(ptr, size):
		return ErrorInvalidValue
	}
	f.mu.maps = append(f.mu.maps, &fakeMapping{ptr: ptr, size: size, mem: p.mem, access: map[int]vmm.Access{}})
	return nil
}

// reserved reports whether [ptr, ptr+size) lies in one reservation.
func (f *fakeCUDA) reserved(ptr vmm.DevicePtr, size uint64) bool {
	for base, n := range f.mu.ranges {
		if ptr >= base && ptr.Add(size) <= base.Add(n) {
			return true
		}
	}
	return false
}

// mapped reports whether anything of [ptr, ptr+size) is mapped.
func (f *fakeCUDA) mapped(ptr vmm.DevicePtr, size uint64) bool {
	for _, m := range f.mu.maps {
		if m.ptr < ptr.Add(size) && ptr < m.ptr.Add(m.size) {
			return true
		}
	}
	return false
}

func (f *fakeCUDA) memUnmap(c cuContext, ptr vmm.DevicePtr, size uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memUnmap", c); err != nil {
		return err
	}
	for i, m := range f.mu.maps {
		if m.ptr == ptr && m.size == size {
			f.mu.maps = append(f.mu.maps[:i], f.mu.maps[i+1:]...)
			return nil
		}
	}
	return ErrorInvalidValue
}

func (f *fakeCUDA) memSetAccess(c cuContext, ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memSetAccess", c); err != nil {
		return err
	}
	var ms []*fakeMapping
	for q := ptr; q < ptr.Add(size); {
		m := f.mappingAt(q)
		if m == nil || m.ptr < ptr || m.ptr.Add(m.size) > ptr.Add(size) {
			return ErrorInvalidValue
		}
		ms = append(ms, m)
		q = m.ptr.Add(m.size)
	}
	for _, a := range access {
		if a.Device < 0 || int(a.Device) >= len(f.devs) || a.Flags > vmm.AccessReadWrite {
			return ErrorInvalidDevice
		}
	}
	for _, m := range ms {
		for _, a := range access {
			m.access[int(a.Device)] = a.Flags
		}
	}
	return nil
}

// mappingAt returns the mapping that holds address p, or nil.
func (f *fakeCUDA) mappingAt(p vmm.DevicePtr) *fakeMapping {
	for _, m := range f.mu.maps {
		if p >= m.ptr && p < m.ptr.Add(m.size) {
			return m
		}
	}
	return nil
}

func (f *fakeCUDA) memGetAccess(c cuContext, d cuDevice, ptr vmm.DevicePtr) (vmm.Access, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memGetAccess", c); err != nil {
		return 0, err
	}
	m := f.mappingAt(ptr)
	if m == nil {
		return 0, ErrorInvalidValue
	}
	return m.access[int(d)], nil
}

// The fake exports a page as the read end of a new pipe, which it knows
// again by its inode.
func (f *fakeCUDA) memExportFD(c cuContext, h vmm.Handle) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memExportFD", c); err != nil {
		return -1, err
	}
	p, ok := f.mu.pages[h]
	if !ok || p.mem.types&vmm.HandlePosixFD == 0 {
		return -1, ErrorInvalidValue
	}
	fd, id, err := newFakeFD()
	if err != nil {
		return -1, ErrorUnknown
	}
	f.mu.shared[id] = p.mem
	return fd, nil
}

func (f *fakeCUDA) memImportFD(c cuContext, fd int) (vmm.Handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memImportFD", c); err != nil {
		return 0, err
	}
	id, err := fakeFDID(fd)
	if err != nil {
		return 0, ErrorInvalidValue
	}
	mem, ok := f.mu.shared[id]
	if !ok {
		return 0, ErrorInvalidValue
	}
	return f.importPage(mem), nil
}

// importPage makes a new handle of mem.
func (f *fakeCUDA) importPage(mem *fakeMem) vmm.Handle {
	h := vmm.Handle(0xa000_0000 + f.id())
	f.mu.pages[h] = &fakePage{mem}
	return h
}

// A fabric handle of the fake holds an id of the exported memory.
func (f *fakeCUDA) memExportFabric(c cuContext, h vmm.Handle) (vmm.FabricHandle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memExportFabric", c); err != nil {
		return vmm.FabricHandle{}, err
	}
	p, ok := f.mu.pages[h]
	if !ok || p.mem.types&vmm.HandleFabric == 0 {
		return vmm.FabricHandle{}, ErrorInvalidValue
	}
	id := 1<<63 | f.id()
	f.mu.shared[id] = p.mem
	var fh vmm.FabricHandle
	binary.LittleEndian.PutUint64(fh[:], id)
	return fh, nil
}

func (f *fakeCUDA) memImportFabric(c cuContext, fh vmm.FabricHandle) (vmm.Handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memImportFabric", c); err != nil {
		return 0, err
	}
	mem, ok := f.mu.shared[binary.LittleEndian.Uint64(fh[:])]
	if !ok || mem.types&vmm.HandleFabric == 0 {
		return 0, ErrorInvalidValue
	}
	return f.importPage(mem), nil
}

func (f *fakeCUDA) memAllocationProperties(c cuContext, h vmm.Handle) (vmm.Device, vmm.HandleType, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memAllocationProperties", c); err != nil {
		return 0, 0, err
	}
	p, ok := f.mu.pages[h]
	if !ok {
		return 0, 0, ErrorInvalidValue
	}
	return vmm.Device(p.mem.dev), p.mem.types, nil
}
