package expandable

import (
	"errors"
	"fmt"
	"sync"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
)

// A Buffer is one growable range of device memory that keeps its address:
// NewBuffer reserves address space for its maximum size and nothing else;
// Grow maps new physical pages at the end of the mapped ones (one Map a
// page and ONE SetAccess for the run), so the contents and Ptr stay where
// they are; Shrink unmaps and releases whole pages at the end. It is what a
// service uses instead of allocate-bigger, copy, free: an embedding store,
// a KV cache, a batch arena.
//
// The buffer's length (Len) is counted in bytes; its capacity (Cap) is the
// mapped bytes, Len rounded up to whole pages; its maximum (Max) is the
// reserved range, which never changes. Bytes between Len and Cap are
// mapped and usable, but a Shrink may take them away.
//
// # Sharing
//
// With BufferOptions.Shareable the pages are created exportable as POSIX
// fds, and the buffer is an ipc.BlockSource: PinBlock(Ptr()) lists the
// pages behind Len and keeps Shrink from unmapping them until the pin's
// Unpin, so ipc.Exporter.ShareBlock(d, buf, buf.Ptr()) shares the buffer
// with another process (the examples/sharing program does this). Pages
// grown after the pin are not part of that share. An exported page stays
// alive for its importers after Close.
//
// # Concurrency
//
// A Buffer is safe for concurrent use. Grow, Shrink, PinBlock, Unpin and
// Close are serialized by a mutex. Ptr and Max never change and take no
// lock. Reading or writing the contents (through the driver's copies, or a
// kernel) while another goroutine shrinks or closes the buffer is the
// caller's business to prevent: the buffer does not know about it.
type Buffer struct {
	d     vmm.Driver
	dev   vmm.Device
	base  vmm.DevicePtr
	max   uint64 // the reserved bytes, a multiple of ps
	ps    uint64
	types vmm.HandleType
	rw    []vmm.AccessDesc

	mu struct {
		sync.Mutex
		len    uint64
		pages  []vmm.Handle // mapped pages in address order, from base
		loose  []vmm.Handle // unmapped pages whose release failed; Close retries
		pins   map[*int]int // live pins: the pages each holds
		st     core.Stats   // as an allocator's, in the large pool
		closed bool
	}
}

// BufferOptions tune NewBuffer. The zero value makes 2 MiB pages that
// cannot be exported.
type BufferOptions struct {
	// PageSize is the size of every page, a multiple of the device's
	// granularity; 0 means 2 MiB (or the granularity, if larger).
	PageSize uint64
	// Shareable creates the pages exportable as POSIX fds
	// (vmm.HandlePosixFD), so Pages can be shared with other processes.
	Shareable bool
}

// DefaultBufferPageSize is the page size of a Buffer whose options name
// none.
const DefaultBufferPageSize = 2 << 20

// NewBuffer reserves maxSize bytes of address space (rounded up to the page
// size) on device dev of d for a buffer of length 0. Nothing is mapped
// yet. The device must support VMM (else vmm.ErrNotSupported); a page size
// that is not a multiple of the granularity, or a max of 0, is
// vmm.ErrInvalid. The buffer does not close d.
func NewBuffer(d vmm.Driver, dev vmm.Device, maxSize uint64, opts BufferOptions) (*Buffer, error) {
	info, err := d.DeviceInfo(dev)
	if err != nil {
		return nil, fmt.Errorf("buffer: device %d: %w", dev, err)
	}
	if !info.VMM {
		return nil, fmt.Errorf("buffer: device %d (%s) has no virtual memory management: %w", dev, info.Name, vmm.ErrNotSupported)
	}
	ps := opts.PageSize
	if ps == 0 {
		ps = max(DefaultBufferPageSize, info.Granularity)
	}
	if info.Granularity == 0 || ps%info.Granularity != 0 {
		return nil, fmt.Errorf("buffer: page size %d is not a multiple of the device's granularity %d: %w", ps, info.Granularity, vmm.ErrInvalid)
	}
	if maxSize == 0 {
		return nil, fmt.Errorf("buffer: maximum size 0: %w", vmm.ErrInvalid)
	}
	if opts.Shareable && !info.PosixFD {
		return nil, fmt.Errorf("buffer: device %d cannot export pages as fds: %w", dev, vmm.ErrNotSupported)
	}
	size := roundUp(maxSize, ps)
	base, err := d.Reserve(size, 0)
	if err != nil {
		return nil, fmt.Errorf("buffer: reserving %d bytes: %w", size, err)
	}
	b := &Buffer{d: d, dev: dev, base: base, max: size, ps: ps, rw: vmm.ReadWrite(dev)}
	if opts.Shareable {
		b.types = vmm.HandlePosixFD
	}
	b.mu.st.Segments.Add(core.Large, 1)
	return b, nil
}

// Ptr is the buffer's address. It never changes, not even across Grow.
func (b *Buffer) Ptr() vmm.DevicePtr { return b.base }

// Max is the largest length the buffer can grow to: the reserved bytes.
func (b *Buffer) Max() uint64 { return b.max }

// PageSize is the size of the buffer's pages.
func (b *Buffer) PageSize() uint64 { return b.ps }

// Device is the device the buffer's memory is on.
func (b *Buffer) Device() vmm.Device { return b.dev }

// Len is the buffer's length in bytes.
func (b *Buffer) Len() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.len
}

// Cap is the bytes mapped behind Ptr: Len rounded up to whole pages.
func (b *Buffer) Cap() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return uint64(len(b.mu.pages)) * b.ps
}

// Grow makes the buffer n bytes longer, mapping as many new pages at the
// end of the mapped ones as that needs (reserved -> accessible for those
// pages): one Create and one Map a page, one SetAccess for the run. The
// address and the contents stay. Growing past Max fails with an error
// matching vmm.ErrOutOfMemory that names the sizes; any failure (the
// driver's OOM included) leaves the buffer as it was.
func (b *Buffer) Grow(n uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.closed {
		return fmt.Errorf("buffer: growing: %w", vmm.ErrClosed)
	}
	have := uint64(len(b.mu.pages)) * b.ps
	if n > b.max-b.mu.len {
		return fmt.Errorf("buffer: growing %d bytes by %d past its maximum of %d bytes: %w", b.mu.len, n, b.max, vmm.ErrOutOfMemory)
	}
	want := roundUp(b.mu.len+n, b.ps)
	if want > have {
		if err := b.mapRun(have, int((want-have)/b.ps)); err != nil {
			return fmt.Errorf("buffer: growing %d bytes by %d: %w", b.mu.len, n, err)
		}
	}
	b.setLen(b.mu.len + n)
	return nil
}

// setLen changes the length and the statistics that follow it.
func (b *Buffer) setLen(n uint64) {
	d := int64(n) - int64(b.mu.len)
	st := &b.mu.st
	for _, p := range []*core.PoolStat{&st.AllocatedBytes, &st.RequestedBytes, &st.ActiveBytes} {
		p.Add(core.Large, d)
	}
	if (b.mu.len == 0) != (n == 0) {
		one := int64(1)
		if n == 0 {
			one = -1
		}
		st.Allocations.Add(core.Large, one)
		st.ActiveBlocks.Add(core.Large, one)
	}
	b.mu.len = n
}

// Stats returns the buffer's statistics with an allocator's meanings, all
// in the large pool, so that metrics.New exports a buffer as it does an
// allocator: allocated, requested and active bytes are Len, reserved bytes
// Cap, one allocation while Len > 0, one segment until Close, and the
// pages mapped, unmapped and created and the set-access calls made.
func (b *Buffer) Stats() core.Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.st
}

// mapRun creates and maps count pages at offset off and sets their access
// with one call. On failure it unmaps and releases what it made.
func (b *Buffer) mapRun(off uint64, count int) error {
	made := make([]vmm.Handle, 0, count)
	undo := func(mapped int) error {
		var errs []error
		for i := mapped - 1; i >= 0; i-- {
			if err := b.d.Unmap(b.base.Add(off+uint64(i)*b.ps), b.ps); err != nil {
				errs = append(errs, fmt.Errorf("undo: unmapping page at %v: %w", b.base.Add(off+uint64(i)*b.ps), err))
			}
		}
		for _, h := range made {
			if err := b.d.Release(h); err != nil {
				errs = append(errs, fmt.Errorf("undo: releasing page %#x: %w", uint64(h), err))
			}
		}
		return errors.Join(errs...)
	}
	for i := range count {
		h, err := b.d.Create(b.dev, b.ps, b.types)
		if err != nil {
			return errors.Join(fmt.Errorf("creating page %d of %d (%d bytes): %w", i+1, count, b.ps, err), undo(i))
		}
		made = append(made, h)
		at := b.base.Add(off + uint64(i)*b.ps)
		if err := b.d.Map(at, b.ps, h, 0); err != nil {
			return errors.Join(fmt.Errorf("mapping page %d of %d at %v: %w", i+1, count, at, err), undo(i))
		}
	}
	size := uint64(count) * b.ps
	if err := b.d.SetAccess(b.base.Add(off), size, b.rw); err != nil {
		return errors.Join(fmt.Errorf("setting access to %d pages at %v: %w", count, b.base.Add(off), err), undo(count))
	}
	b.mu.pages = append(b.mu.pages, made...)
	st := &b.mu.st
	st.ReservedBytes.Add(core.Large, int64(size))
	st.Maps += int64(count)
	st.PagesCreated += int64(count)
	st.SetAccessCalls++
	return nil
}
