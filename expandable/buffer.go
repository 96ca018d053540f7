package expandable

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/internal/pagerun"
	"github.com/xseg-dev/xseg/spec"
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
		len   uint64
		pages []vmm.Handle // mapped pages in address order, from base
		loose []vmm.Handle // unmapped pages whose release failed; Close retries
		// stuck are pages a failed Grow could not unmap, mapped from
		// offset stuckAt without access; the next Grow or Close unmaps them.
		stuck   []vmm.Handle
		stuckAt uint64
		pins    map[*int]int // live pins: the pages each holds
		st      core.Stats   // as an allocator's, in the large pool
		closed  bool         // by the first Close
		// unreserved: Close gave the range back, the last thing it does.
		unreserved bool
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
// that is not a multiple of the granularity, a max of 0, or one that
// rounds up to whole pages past 2^64-1, is vmm.ErrInvalid. The buffer does not close d.
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
	if maxSize > math.MaxUint64-(ps-1) {
		return nil, fmt.Errorf("buffer: maximum size %d rounded up to whole pages of %d bytes passes 2^64-1: %w", maxSize, ps, vmm.ErrInvalid)
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
// driver's OOM included) leaves Len, Cap and the contents as they were.
// If the undo of a failed map fails too, the pages it could not unmap are
// kept (not in Cap) and the next Grow or Close unmaps and releases them.
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
func (b *Buffer) Stats() spec.Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.st
}

// mapRun creates count pages and maps them at offset off, setting their
// access with one call. On failure it releases what it made; pages whose
// unmap failed in the undo are kept as stuck (the driver has them mapped
// there), and a later Grow or Close unmaps and releases them. Stuck pages
// of an earlier failure are unmapped first: the run may cover them.
func (b *Buffer) mapRun(off uint64, count int) error {
	if err := b.unstick(); err != nil {
		return err
	}
	made := make([]vmm.Handle, count)
	left, err := pagerun.MapFrom(b.d, b.base.Add(off), b.ps, made, b.rw, pagerun.Source{
		Take: func(i int) (vmm.Handle, error) {
			h, err := b.d.Create(b.dev, b.ps, b.types)
			if err != nil {
				return 0, fmt.Errorf("creating page %d of %d (%d bytes): %w", i+1, count, b.ps, err)
			}
			return h, nil
		},
		Give: b.release,
	})
	if err != nil {
		b.mu.stuck, b.mu.stuckAt = made[:left], off
		return err
	}
	size := uint64(count) * b.ps
	b.mu.pages = append(b.mu.pages, made...)
	st := &b.mu.st
	st.ReservedBytes.Add(core.Large, int64(size))
	st.Maps += int64(count)
	st.PagesCreated += int64(count)
	st.SetAccessCalls++
	return nil
}

// unstick unmaps the pages a failed undo left mapped and releases them.
// On error they stay stuck.
func (b *Buffer) unstick() error {
	if len(b.mu.stuck) == 0 {
		return nil
	}
	if err := pagerun.Unmap(b.d, b.base.Add(b.mu.stuckAt), b.ps, len(b.mu.stuck)); err != nil {
		return fmt.Errorf("pages left mapped by a failed undo: %w", err)
	}
	err := b.release(b.mu.stuck)
	b.mu.stuck = nil
	return err
}

// release releases unmapped pages; those that fail go to loose, which
// Close retries.
func (b *Buffer) release(hs []vmm.Handle) error {
	var errs []error
	for _, h := range hs {
		if err := b.d.Release(h); err != nil {
			b.mu.loose = append(b.mu.loose, h)
			errs = append(errs, fmt.Errorf("releasing page %#x: %w", uint64(h), err))
		}
	}
	return errors.Join(errs...)
}
