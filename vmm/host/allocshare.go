package host

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/xseg-dev/xseg/vmm"
)

// Sharing plain allocations. MemAlloc makes anonymous memory, which no
// other process can map, and spends no file descriptor. The first
// ExportAllocFD of an allocation moves it into a memfd: it makes the file
// (named like an exportable page, so an importer reads its device from the
// name), copies the allocation's bytes into it, skipping zero runs so a
// sparse allocation stays sparse, and maps the file MAP_FIXED|MAP_SHARED
// over the same addresses, which atomically replaces the anonymous
// mapping. The allocation keeps its address and contents; the file serves
// every later export and is closed by MemFree (importers hold their own
// references). Only allocations that are shared ever cost an fd.
//
// The move must not race writes to the allocation made behind the driver's
// back (through a raw pointer): a byte written between its copy and the
// remap would be lost. The driver's own copies and memsets are ordered
// against it (it holds d.prot exclusively).

// copyChunk is the unit of the copy into the memfd; all-zero chunks are
// skipped.
const copyChunk = 64 << 10

// ExportAllocFD returns a new fd (close-on-exec, the caller's) of the memfd
// holding the plain allocation that starts at ptr, moving the allocation
// into one on first use (see above), and the file's size: the allocation
// rounded up to the granularity, so that ImportFD accepts it. ptr must be
// a pointer MemAlloc returned (else vmm.ErrInvalid). On failure the
// allocation is as it was, unless the final remap itself failed, which the
// error says.
func (d *Driver) ExportAllocFD(ptr vmm.DevicePtr) (int, uint64, error) {
	if err := d.enter(); err != nil {
		return -1, 0, err
	}
	defer d.life.RUnlock()
	if _, err := d.books.Alloc("exporting the allocation at", ptr); err != nil {
		return -1, 0, err
	}
	d.prot.Lock()
	defer d.prot.Unlock()
	d.mu.Lock()
	a, ok := d.mu.allocs[ptr]
	d.mu.Unlock()
	if !ok {
		return -1, 0, fmt.Errorf("exporting the allocation at %v: freed meanwhile: %w", ptr, vmm.ErrInvalid)
	}
	if a.memfd < 0 {
		var err error
		if a, err = d.moveToMemfd(ptr, a); err != nil {
			return -1, 0, err
		}
		d.mu.Lock()
		d.mu.allocs[ptr] = a
		d.mu.Unlock()
	}
	fd, err := dupFD(a.memfd)
	if err != nil {
		return -1, 0, fmt.Errorf("exporting the allocation at %v: dup: %w", ptr, sysErr(err))
	}
	return fd, a.fileSize, nil
}

// moveToMemfd puts allocation a at ptr in a new memfd and maps it there.
// d.prot is held exclusively. On failure the memfd is closed.
func (d *Driver) moveToMemfd(ptr vmm.DevicePtr, a allocation) (allocation, error) {
	size, ok := roundUp(a.size, d.opts.Granularity)
	if !ok {
		return a, fmt.Errorf("exporting the allocation at %v: %d bytes: %w", ptr, a.size, vmm.ErrInvalid)
	}
	fd, err := createSealable(memfdPrefix + strconv.Itoa(int(a.dev)))
	if err != nil {
		return a, fmt.Errorf("exporting the allocation at %v: memfd_create: %w", ptr, sysErr(err))
	}
	if err := fillMemfd(fd, ptr, a.size, size); err != nil {
		return a, fmt.Errorf("exporting the allocation at %v: %w (closing the memfd: %v)", ptr, err, closeFD(fd))
	}
	if err := mapFile(uintptr(ptr), a.size, protRead|protWrite, fd, 0); err != nil {
		return a, fmt.Errorf("exporting the allocation at %v: mapping its memfd over it (the allocation may be lost): %w (closing the memfd: %v)",
			ptr, sysErr(err), closeFD(fd))
	}
	a.memfd, a.fileSize = fd, size
	return a, nil
}

// fillMemfd sizes fd to size bytes, seals that size (importers must not
// be able to truncate the file under the allocation: see seal.go) and
// copies the n bytes at ptr into its start, skipping chunks that are all
// zero (the file reads zero there).
func fillMemfd(fd int, ptr vmm.DevicePtr, n, size uint64) error {
	if err := sizeAndSeal(fd, size); err != nil {
		return err
	}
	src := hostBytes(ptr, n)
	zero := make([]byte, copyChunk)
	for off := uint64(0); off < n; off += copyChunk {
		part := src[off:min(off+copyChunk, n)]
		if bytes.Equal(part, zero[:len(part)]) {
			continue
		}
		for done := 0; done < len(part); {
			w, err := pwrite(fd, part[done:], int64(off)+int64(done))
			if err != nil {
				return fmt.Errorf("copying byte %d of the allocation into the memfd: %w", off+uint64(done), sysErr(err))
			}
			done += w
		}
	}
	return nil
}
