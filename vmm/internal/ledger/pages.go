package ledger

import (
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// AddPage records a page the backend has just created or imported.
func (l *Ledger) AddPage(h vmm.Handle, dev vmm.Device, size uint64, types vmm.HandleType) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addPage(Page{Handle: h, Device: dev, Size: size, Types: types})
}

// AddImportedPage records a page imported from a shareable handle whose
// size the backend cannot learn: bound is an upper bound of it (the device's
// memory). Such a page may be mapped from offset 0 with any size up to
// bound; the driver refuses a size that is not the page's.
func (l *Ledger) AddImportedPage(h vmm.Handle, dev vmm.Device, bound uint64, types vmm.HandleType) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addPage(Page{Handle: h, Device: dev, Size: bound, Types: types, bound: true})
}

func (l *Ledger) addPage(p Page) {
	if i, ok := l.pages[p.Handle]; ok {
		// The handle is live already (a backend's bug, or a driver
		// handing back a handle it knows): the new page replaces it.
		l.usage.Handles--
		l.usage.HandleBytes -= l.pageRecs[i].Size
		p.maps = l.pageRecs[i].maps
		l.pageRecs[i] = p
	} else if n := len(l.freePages); n > 0 {
		i, l.freePages = l.freePages[n-1], l.freePages[:n-1]
		l.pageRecs[i] = p
		l.pages[p.Handle] = i
	} else {
		l.pages[p.Handle] = uint32(len(l.pageRecs))
		l.pageRecs = append(l.pageRecs, p)
	}
	l.usage.Handles++
	l.usage.HandleBytes += p.Size
}

// Page returns a copy of the live page h.
func (l *Ledger) Page(h vmm.Handle) (Page, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.pages[h]
	if !ok {
		return Page{}, fmt.Errorf("page handle %#x is not live: %w", uint64(h), vmm.ErrInvalid)
	}
	return l.pageRecs[i], nil
}

// BeginRelease checks that h is a live page that is not mapped and removes
// it from the books. It returns the page for the backend's use.
func (l *Ledger) BeginRelease(h vmm.Handle) (Page, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.pages[h]
	if !ok {
		return Page{}, fmt.Errorf("releasing page handle %#x: not a live page (released twice?): %w", uint64(h), vmm.ErrInvalid)
	}
	p := l.pageRecs[i]
	if p.maps > 0 {
		return Page{}, fmt.Errorf("releasing page handle %#x: still mapped %d times: %w", uint64(h), p.maps, vmm.ErrInUse)
	}
	delete(l.pages, h)
	l.pageRecs[i] = Page{}
	l.freePages = append(l.freePages, i)
	l.usage.Handles--
	l.usage.HandleBytes -= p.Size
	return p, nil
}

// UndoRelease puts back a page BeginRelease removed.
func (l *Ledger) UndoRelease(p Page) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p.maps = 0
	l.addPage(p)
}

// BeginMap checks a Map call and records the mapping: [ptr, ptr+size) is
// aligned, inside one reservation, overlaps no mapping, and [offset,
// offset+size) lies inside page h.
func (l *Ledger) BeginMap(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) (Mapping, error) {
	if err := l.checkAligned("mapping", ptr, size); err != nil {
		return Mapping{}, err
	}
	if offset&(l.gran-1) != 0 {
		return Mapping{}, fmt.Errorf("mapping at %v: page offset %d is not aligned to %d: %w", ptr, offset, l.gran, vmm.ErrInvalid)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	pi, ok := l.pages[h]
	if !ok {
		return Mapping{}, fmt.Errorf("mapping at %v: page handle %#x is not live: %w", ptr, uint64(h), vmm.ErrInvalid)
	}
	p := &l.pageRecs[pi]
	if offset+size > p.Size || offset+size < offset {
		return Mapping{}, fmt.Errorf("mapping at %v: %d bytes from offset %d exceed the page's %d: %w", ptr, size, offset, p.Size, vmm.ErrInvalid)
	}
	r, g, ok := l.rangeOf(ptr, size)
	if !ok {
		return Mapping{}, fmt.Errorf("mapping %v+%d: not inside a reserved range: %w", ptr, size, vmm.ErrInvalid)
	}
	n := size >> l.shift
	if !r.isFree(g, n) {
		return Mapping{}, fmt.Errorf("mapping %v+%d: overlaps %d existing mappings: %w", ptr, size, l.mappingsIn(r, g, n), vmm.ErrInvalid)
	}
	if offset != 0 || (size != p.Size && !p.bound) {
		return Mapping{}, fmt.Errorf("mapping %v: %d bytes from offset %d of a %d-byte page: only whole pages can be mapped (CUDA requires it): %w", ptr, size, offset, p.Size, vmm.ErrNotSupported)
	}
	p.maps++
	m := Mapping{Ptr: ptr, Size: size, Handle: h, Offset: offset, Device: p.Device}
	l.insert(r, g, mapRec{Mapping: m, page: pi})
	return m, nil
}

// insert records rec, whose granules [g, ...) in r are free, and counts it.
// The caller has counted it in its page.
func (l *Ledger) insert(r *reservation, g uint64, rec mapRec) {
	acc := l.intern(rec.Access)
	rec.Access = nil
	var i uint32
	if n := len(l.freeMaps); n > 0 {
		i, l.freeMaps = l.freeMaps[n-1], l.freeMaps[:n-1]
		l.maps[i], l.accs[i] = rec, acc
	} else {
		i = uint32(len(l.maps))
		l.maps, l.accs = append(l.maps, rec), append(l.accs, acc)
	}
	l.fill(r, g, rec.Size>>l.shift, i+1)
	r.mappings++
	l.usage.Mappings++
	l.usage.MappedBytes += rec.Size
}

// view returns a copy of the mapping in slot s, with its access list.
func (l *Ledger) view(s uint32) Mapping {
	m := l.maps[s-1].Mapping
	m.Access = l.lists[l.accs[s-1]]
	return m
}

// remove forgets the mapping in slot s, which starts at granule g of r,
// and uncounts it in its page.
func (l *Ledger) remove(r *reservation, g uint64, s uint32) {
	rec := l.at(s)
	if rec.page != noPage {
		l.pageRecs[rec.page].maps--
	}
	size := rec.Size
	*rec, l.accs[s-1] = mapRec{}, 0
	l.freeMaps = append(l.freeMaps, s-1)
	l.fill(r, g, size>>l.shift, 0)
	r.mappings--
	l.usage.Mappings--
	l.usage.MappedBytes -= size
}

// UndoMap removes a mapping BeginMap recorded.
func (l *Ledger) UndoMap(m Mapping) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rangeAt(m.Ptr)
	if r == nil {
		return
	}
	g := uint64(m.Ptr-r.ptr) >> l.shift
	s := r.slot(g)
	if s == 0 {
		return
	}
	if rec := l.at(s); rec.Ptr != m.Ptr || rec.Size != m.Size || rec.Handle != m.Handle {
		return // not the mapping BeginMap recorded
	}
	l.remove(r, g, s)
}

// covering checks that whole mappings cover [ptr, ptr+size) exactly and
// contiguously, and returns how many there are.
func (l *Ledger) covering(what string, ptr vmm.DevicePtr, size uint64) (int, error) {
	if err := l.checkAligned(what, ptr, size); err != nil {
		return 0, err
	}
	w := walk{l: l, at: ptr}
	if w.slot() == 0 {
		return 0, l.notMapped(what, ptr, size)
	}
	n, maps := 0, l.maps
	for end := ptr.Add(size); w.at < end; n++ {
		s := w.slot()
		if s == 0 || maps[s-1].Ptr != w.at || maps[s-1].Size > uint64(end-w.at) {
			return 0, l.notCovered(what, ptr, size, w.at)
		}
		w.at = w.at.Add(maps[s-1].Size)
	}
	return n, nil
}

func (l *Ledger) notMapped(what string, ptr vmm.DevicePtr, size uint64) error {
	return fmt.Errorf("%s %v+%d: nothing is mapped at %v: %w", what, ptr, size, ptr, vmm.ErrInvalid)
}

func (l *Ledger) notCovered(what string, ptr vmm.DevicePtr, size uint64, at vmm.DevicePtr) error {
	return fmt.Errorf("%s %v+%d: mappings do not cover it exactly (gap or partial mapping at %v): %w", what, ptr, size, at, vmm.ErrInvalid)
}

// BeginUnmap finds the whole mappings that exactly cover [ptr, ptr+size),
// removes them from the books and returns them appended to into (which
// may be nil; a caller that passes a buffer with room allocates nothing).
func (l *Ledger) BeginUnmap(ptr vmm.DevicePtr, size uint64, into []Mapping) ([]Mapping, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.covering("unmapping", ptr, size)
	if err != nil {
		return into, err
	}
	into = slices.Grow(into, n)
	w := walk{l: l, at: ptr} // outside the loop: one variable, not one an iteration
	for ; n > 0; n-- {
		s := w.slot()
		rec := l.at(s)
		into = append(into, l.view(s))
		r, g := w.k.r, uint64(w.at-w.k.r.ptr)>>l.shift
		w.at = w.at.Add(rec.Size)
		l.remove(r, g, s)
		w.k.c = nil // remove may have let the chunk go
	}
	return into, nil
}

// UndoUnmap puts back mappings BeginUnmap removed (those the backend failed
// to unmap). A mapping whose place was taken meanwhile (a racing Map that
// the backend will undo) is left out.
func (l *Ledger) UndoUnmap(ms []Mapping) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range ms {
		r, g, ok := l.rangeOf(m.Ptr, m.Size)
		if !ok || !r.isFree(g, m.Size>>l.shift) {
			continue
		}
		pi, live := l.pages[m.Handle]
		if live {
			l.pageRecs[pi].maps++
		} else {
			pi = noPage
		}
		l.insert(r, g, mapRec{Mapping: m, page: pi})
	}
}

// Lookup returns the mapping that contains ptr.
func (l *Ledger) Lookup(ptr vmm.DevicePtr) (Mapping, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.slotAt(ptr); s != 0 {
		return l.view(s), true
	}
	return Mapping{}, false
}

// Accessible reports whether dev may access all of [ptr, ptr+n) with at least
// the given flags: every byte is mapped and dev was granted access.
func (l *Ledger) Accessible(ptr vmm.DevicePtr, n uint64, dev vmm.Device, want vmm.Access) error {
	if err := checkWrap(Span{Ptr: ptr, N: n}); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	end := ptr.Add(n)
	for p := ptr; p < end; {
		s := l.slotAt(p)
		if s == 0 {
			return fmt.Errorf("address %v is not mapped: %w", p, vmm.ErrInvalid)
		}
		granted := vmm.AccessNone
		for _, a := range l.lists[l.accs[s-1]] {
			if a.Device == dev {
				granted = a.Flags
			}
		}
		if granted&want != want {
			return fmt.Errorf("address %v: device %d has no %s access: %w", p, dev, accessName(want), vmm.ErrInvalid)
		}
		p = l.at(s).end()
	}
	return nil
}

func accessName(a vmm.Access) string {
	if a == vmm.AccessReadWrite {
		return "write"
	}
	return "read"
}
