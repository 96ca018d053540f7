package ledger

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// AddPage records a page the backend has just created or imported.
func (l *Ledger) AddPage(h vmm.Handle, dev vmm.Device, size uint64, types vmm.HandleType) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pages[h] = Page{Handle: h, Device: dev, Size: size, Types: types}
	l.usage.Handles++
	l.usage.HandleBytes += size
}

// AddImportedPage records a page imported from a shareable handle whose
// size the backend cannot learn: bound is an upper bound of it (the device's
// memory). Such a page may be mapped from offset 0 with any size up to
// bound; the driver refuses a size that is not the page's.
func (l *Ledger) AddImportedPage(h vmm.Handle, dev vmm.Device, bound uint64, types vmm.HandleType) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pages[h] = Page{Handle: h, Device: dev, Size: bound, Types: types, bound: true}
	l.usage.Handles++
	l.usage.HandleBytes += bound
}

// Page returns a copy of the live page h.
func (l *Ledger) Page(h vmm.Handle) (Page, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pages[h]
	if !ok {
		return Page{}, fmt.Errorf("page handle %#x is not live: %w", uint64(h), vmm.ErrInvalid)
	}
	return p, nil
}

// BeginRelease checks that h is a live page that is not mapped and removes
// it from the books. It returns the page for the backend's use.
func (l *Ledger) BeginRelease(h vmm.Handle) (Page, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pages[h]
	if !ok {
		return Page{}, fmt.Errorf("releasing page handle %#x: not a live page (released twice?): %w", uint64(h), vmm.ErrInvalid)
	}
	if p.maps > 0 {
		return Page{}, fmt.Errorf("releasing page handle %#x: still mapped %d times: %w", uint64(h), p.maps, vmm.ErrInUse)
	}
	delete(l.pages, h)
	l.usage.Handles--
	l.usage.HandleBytes -= p.Size
	return p, nil
}

// UndoRelease puts back a page BeginRelease removed.
func (l *Ledger) UndoRelease(p Page) {
	if p.bound {
		l.AddImportedPage(p.Handle, p.Device, p.Size, p.Types)
		return
	}
	l.AddPage(p.Handle, p.Device, p.Size, p.Types)
}

// BeginMap checks a Map call and records the mapping: [ptr, ptr+size) is
// aligned, inside one reservation, overlaps no mapping, and [offset,
// offset+size) lies inside page h.
func (l *Ledger) BeginMap(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) (Mapping, error) {
	if err := l.checkAligned("mapping", ptr, size); err != nil {
		return Mapping{}, err
	}
	if offset%l.gran != 0 {
		return Mapping{}, fmt.Errorf("mapping at %v: page offset %d is not aligned to %d: %w", ptr, offset, l.gran, vmm.ErrInvalid)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pages[h]
	if !ok {
		return Mapping{}, fmt.Errorf("mapping at %v: page handle %#x is not live: %w", ptr, uint64(h), vmm.ErrInvalid)
	}
	if offset+size > p.Size || offset+size < offset {
		return Mapping{}, fmt.Errorf("mapping at %v: %d bytes from offset %d exceed the page's %d: %w", ptr, size, offset, p.Size, vmm.ErrInvalid)
	}
	end := ptr.Add(size)
	if _, ok := l.rangeOf(ptr, end); !ok {
		return Mapping{}, fmt.Errorf("mapping %v+%d: not inside a reserved range: %w", ptr, size, vmm.ErrInvalid)
	}
	if l.overlaps(ptr, end) {
		n := l.mappingsIn(ptr, end)
		return Mapping{}, fmt.Errorf("mapping %v+%d: overlaps %d existing mappings: %w", ptr, size, n, vmm.ErrInvalid)
	}
	if offset != 0 || (size != p.Size && !p.bound) {
		return Mapping{}, fmt.Errorf("mapping %v: %d bytes from offset %d of a %d-byte page: only whole pages can be mapped (CUDA requires it): %w", ptr, size, offset, p.Size, vmm.ErrNotSupported)
	}
	m := &Mapping{Ptr: ptr, Size: size, Handle: h, Offset: offset, Device: p.Device}
	l.maps.ReplaceOrInsert(m)
	l.countMaps(h, 1)
	l.usage.Mappings++
	l.usage.MappedBytes += size
	return *m, nil
}

// countMaps adds n to the count of page h's mappings, if h is live.
func (l *Ledger) countMaps(h vmm.Handle, n int) {
	if p, ok := l.pages[h]; ok {
		p.maps += n
		l.pages[h] = p
	}
}

// UndoMap removes a mapping BeginMap recorded.
func (l *Ledger) UndoMap(m Mapping) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropMapping(m)
}

func (l *Ledger) dropMapping(m Mapping) {
	key, _ := l.keys(m.Ptr, 0)
	if _, ok := l.maps.Delete(key); !ok {
		return
	}
	l.countMaps(m.Handle, -1)
	l.usage.Mappings--
	l.usage.MappedBytes -= m.Size
}

// covering returns the mappings that exactly and contiguously cover
// [ptr, ptr+size), in l.run: valid until the next call, with mu held.
func (l *Ledger) covering(what string, ptr vmm.DevicePtr, size uint64) ([]*Mapping, error) {
	if err := l.checkAligned(what, ptr, size); err != nil {
		return nil, err
	}
	end := ptr.Add(size)
	clear(l.run) // let go of the last call's mappings
	ms := l.run[:0]
	defer func() {
		if l.run = ms; cap(ms) > 1024 {
			l.run = nil
		}
	}()
	next := ptr
	lo, hi := l.keys(ptr, end)
	l.maps.AscendRange(lo, hi, func(m *Mapping) bool {
		if m.Ptr != next {
			return false
		}
		ms = append(ms, m)
		next = m.end()
		return true
	})
	if next != end {
		if len(ms) == 0 {
			return nil, fmt.Errorf("%s %v+%d: nothing is mapped at %v: %w", what, ptr, size, ptr, vmm.ErrInvalid)
		}
		return nil, fmt.Errorf("%s %v+%d: mappings do not cover it exactly (gap or partial mapping at %v): %w", what, ptr, size, next, vmm.ErrInvalid)
	}
	return ms, nil
}

// BeginUnmap finds the whole mappings that exactly cover [ptr, ptr+size) and
// removes them from the books.
func (l *Ledger) BeginUnmap(ptr vmm.DevicePtr, size uint64) ([]Mapping, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ms, err := l.covering("unmapping", ptr, size)
	if err != nil {
		return nil, err
	}
	out := make([]Mapping, len(ms))
	for i, m := range ms {
		out[i] = *m
		l.dropMapping(*m)
	}
	return out, nil
}

// UndoUnmap puts back mappings BeginUnmap removed (those the backend failed
// to unmap).
func (l *Ledger) UndoUnmap(ms []Mapping) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range ms {
		l.maps.ReplaceOrInsert(&m)
		l.countMaps(m.Handle, 1)
		l.usage.Mappings++
		l.usage.MappedBytes += m.Size
	}
}

// Lookup returns the mapping that contains ptr.
func (l *Ledger) Lookup(ptr vmm.DevicePtr) (Mapping, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.mappingAt(ptr); m != nil {
		return *m, true
	}
	return Mapping{}, false
}

// Accessible reports whether dev may access all of [ptr, ptr+n) with at least
// the given flags: every byte is mapped and dev was granted access.
func (l *Ledger) Accessible(ptr vmm.DevicePtr, n uint64, dev vmm.Device, want vmm.Access) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	end := ptr.Add(n)
	for p := ptr; p < end; {
		m := l.mappingAt(p)
		if m == nil {
			return fmt.Errorf("address %v is not mapped: %w", p, vmm.ErrInvalid)
		}
		granted := vmm.AccessNone
		for _, a := range m.Access {
			if a.Device == dev {
				granted = a.Flags
			}
		}
		if granted&want != want {
			return fmt.Errorf("address %v: device %d has no %s access: %w", p, dev, accessName(want), vmm.ErrInvalid)
		}
		p = m.end()
	}
	return nil
}

func accessName(a vmm.Access) string {
	if a == vmm.AccessReadWrite {
		return "write"
	}
	return "read"
}
