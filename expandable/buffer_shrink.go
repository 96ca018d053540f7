package expandable

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
)

// Shrink makes the buffer n bytes shorter and unmaps and releases every
// whole page past the new length, from the end (accessible -> reserved ->
// none for those pages). Shrinking by more than Len is vmm.ErrInvalid, and
// unmapping a page pinned by PinBlock vmm.ErrInUse; both change nothing. If the driver fails part way, the length is still the
// new one, the pages unmapped so far are gone, the others stay mapped (Cap
// says how many; a later Shrink, even by 0, tries again) and the error says
// so; a page that fails to release is released again by Close.
func (b *Buffer) Shrink(n uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.closed {
		return fmt.Errorf("buffer: shrinking: %w", vmm.ErrClosed)
	}
	if n > b.mu.len {
		return fmt.Errorf("buffer: shrinking %d bytes by %d: %w", b.mu.len, n, vmm.ErrInvalid)
	}
	keep := int(roundUp(b.mu.len-n, b.ps) / b.ps)
	if p := b.pinnedPages(); keep < p {
		return fmt.Errorf("buffer: shrinking %d bytes by %d would unmap pages pinned for sharing (%d pinned): %w", b.mu.len, n, p, vmm.ErrInUse)
	}
	b.setLen(b.mu.len - n)
	if err := b.unmapTail(keep); err != nil {
		return fmt.Errorf("buffer: shrinking to %d bytes: %w", b.mu.len, err)
	}
	return nil
}

// unmapTail unmaps and releases the mapped pages from the last down to
// index keep. It stops at the first failed unmap.
func (b *Buffer) unmapTail(keep int) error {
	var errs []error
	for i := len(b.mu.pages) - 1; i >= keep; i-- {
		at := b.base.Add(uint64(i) * b.ps)
		if err := b.d.Unmap(at, b.ps); err != nil {
			errs = append(errs, fmt.Errorf("unmapping page %d at %v (%d pages stay mapped): %w", i, at, i+1, err))
			break
		}
		h := b.mu.pages[i]
		b.mu.pages = b.mu.pages[:i]
		b.mu.st.Unmaps++
		b.mu.st.ReservedBytes.Add(core.Large, -int64(b.ps))
		if err := b.d.Release(h); err != nil {
			b.mu.loose = append(b.mu.loose, h)
			errs = append(errs, fmt.Errorf("releasing page %d (%#x): %w", i, uint64(h), err))
		}
	}
	return errors.Join(errs...)
}

// Close unmaps and releases every page and gives the reservation back
// (accessible -> reserved -> none). It does not close the driver. Other
// methods fail with vmm.ErrClosed after the first Close. Pinned pages are
// unmapped too: processes that imported them keep their own references.
// If the driver fails, Close returns what failed and keeps what it could
// not give back; a later Close tries again and returns an error until
// everything is given back. Once a Close has returned nil, later calls
// return nil.
func (b *Buffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.closed && b.mu.unreserved {
		return nil
	}
	if !b.mu.closed {
		b.mu.closed, b.mu.pins = true, nil
		b.setLen(0)
	}
	err := errors.Join(b.unmapTail(0), b.unstick())
	loose := b.mu.loose
	b.mu.loose = nil
	err = errors.Join(err, b.release(loose))
	if len(b.mu.pages) == 0 && len(b.mu.stuck) == 0 && len(b.mu.loose) == 0 {
		// The range goes last: a page still held keeps the buffer open
		// to another Close.
		if uerr := b.d.Unreserve(b.base, b.max); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unreserving %d bytes at %v: %w", b.max, b.base, uerr))
		} else {
			b.mu.unreserved = true
			b.mu.st.Segments.Add(core.Large, -1)
		}
	}
	if err != nil {
		return fmt.Errorf("buffer: closing: %w", err)
	}
	return nil
}
