package ledger

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Access lists are interned: the ledger keeps each distinct list once, in
// Ledger.lists (id 0 is the empty list), and a mapping holds the id of its
// list in Ledger.accs, next to its slot's index. Granting access over a run
// then reads the run's slots and writes one small id a mapping, and the
// Mappings handed out share the interned lists (never changed in place).
// The distinct lists are few: one per combination of devices and flags in
// use.

// AccessUndo is what RestoreAccess needs to undo a GrantAccess: the
// access the mappings of [Ptr, End) had before, as runs of mappings that
// had the same. It is a value; the common case, a run whose mappings all
// had the same access, needs no allocation.
type AccessUndo struct {
	first accessRun
	more  []accessRun
}

// accessRun is [ptr, end), whose mappings all had the access list acc.
type accessRun struct {
	ptr, end vmm.DevicePtr
	acc      uint32
}

// checkAccess refuses unknown access flags, a device listed twice (which
// of its two entries holds would be the backend's guess; a mapping keeps
// one entry a device) and an empty list.
func checkAccess(ptr vmm.DevicePtr, access []vmm.AccessDesc) error {
	for i, a := range access {
		if a.Flags != vmm.AccessNone && a.Flags != vmm.AccessRead && a.Flags != vmm.AccessReadWrite {
			return fmt.Errorf("setting access at %v: unknown access flags %#x: %w", ptr, uint32(a.Flags), vmm.ErrInvalid)
		}
		for _, b := range access[:i] {
			if b.Device == a.Device {
				return fmt.Errorf("setting access at %v: device %d is listed twice: %w", ptr, a.Device, vmm.ErrInvalid)
			}
		}
	}
	if len(access) == 0 {
		return fmt.Errorf("setting access at %v: no access descriptors: %w", ptr, vmm.ErrInvalid)
	}
	return nil
}

// GrantAccess checks that [ptr, ptr+size) is covered by mappings and
// records the access granted, as SetAccess does. It returns the access
// the mappings had before, for RestoreAccess, in a form that costs no
// allocation for a run of mappings that shared their access.
func (l *Ledger) GrantAccess(ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) (AccessUndo, error) {
	if err := checkAccess(ptr, access); err != nil {
		return AccessUndo{}, err
	}
	if err := l.checkAligned("setting access", ptr, size); err != nil {
		return AccessUndo{}, err
	}
	l.mu.Lock()
	u, err := l.grantAccess(ptr, size, access)
	l.mu.Unlock()
	return u, err
}

// grantAccess checks the cover and grants as it goes, in one walk; a gap
// found on the way undoes what was granted.
func (l *Ledger) grantAccess(ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) (u AccessUndo, err error) {
	w := walk{l: l, at: ptr}
	if w.slot() == 0 {
		return AccessUndo{}, l.notMapped("setting access", ptr, size)
	}
	cur := &u.first
	var newID uint32
	maps, accs := l.maps, l.accs
	for end, first := ptr.Add(size), true; w.at < end; first = false {
		s := w.slot()
		if s == 0 || maps[s-1].Ptr != w.at || maps[s-1].Size > uint64(end-w.at) {
			l.restore(u)
			return AccessUndo{}, l.notCovered("setting access", ptr, size, w.at)
		}
		i := s - 1
		if old := accs[i]; first || old != cur.acc {
			if !first {
				u.more = append(u.more, accessRun{ptr: w.at, acc: old})
				cur = &u.more[len(u.more)-1]
			} else {
				*cur = accessRun{ptr: w.at, acc: old}
			}
			newID = l.merge(old, access)
		}
		accs[i] = newID
		w.at = w.at.Add(maps[i].Size)
		cur.end = w.at
	}
	return u, nil
}

// RestoreAccess puts back the access a GrantAccess changed.
func (l *Ledger) RestoreAccess(u AccessUndo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.restore(u)
}

func (l *Ledger) restore(u AccessUndo) {
	l.restoreRun(u.first)
	for _, r := range u.more {
		l.restoreRun(r)
	}
}

// restoreRun gives the mappings in [run.ptr, run.end) (those still there)
// the access run recorded.
func (l *Ledger) restoreRun(run accessRun) {
	w := walk{l: l, at: run.ptr} // outside the loop: one variable, not one an iteration
	for w.at < run.end {
		s := w.slot()
		if s == 0 {
			w.at = w.at.Add(l.gran)
			continue
		}
		l.accs[s-1] = run.acc
		w.at = l.at(s).end()
	}
}

// SetAccess checks that [ptr, ptr+size) is covered by mappings and records
// the access granted. It returns copies of the mappings, with the access
// they had before, for UndoAccess. GrantAccess does the same without
// copying the mappings.
func (l *Ledger) SetAccess(ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) ([]Mapping, error) {
	if err := checkAccess(ptr, access); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.covering("setting access", ptr, size)
	if err != nil {
		return nil, err
	}
	old := make([]Mapping, 0, n)
	var lastOld, lastNew uint32
	w := walk{l: l, at: ptr} // outside the loop: one variable, not one an iteration
	for first := true; len(old) < n; first = false {
		s := w.slot()
		old = append(old, l.view(s))
		if o := l.accs[s-1]; first || o != lastOld {
			lastOld, lastNew = o, l.merge(o, access)
		}
		l.accs[s-1] = lastNew
		w.at = l.at(s).end()
	}
	return old, nil
}

// UndoAccess restores the access of mappings SetAccess changed.
func (l *Ledger) UndoAccess(ms []Mapping) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range ms {
		if r := l.rangeAt(o.Ptr); r != nil {
			if s := r.slot(uint64(o.Ptr-r.ptr) >> l.shift); s != 0 && l.at(s).Ptr == o.Ptr {
				l.accs[s-1] = l.intern(o.Access)
			}
		}
	}
}

// merge returns the id of list old with set applied. Granting what a
// mapping has already allocates nothing, nor does granting a list that
// some mapping has had before.
func (l *Ledger) merge(old uint32, set []vmm.AccessDesc) uint32 {
	cur := l.lists[old]
	if len(set) == 1 && len(cur) == 1 && cur[0] == set[0] {
		return old
	}
	l.scratch = appendMerged(l.scratch[:0], cur, set)
	return l.intern(l.scratch)
}

// intern returns the id of list, which it adds (a copy) if it is new.
func (l *Ledger) intern(list []vmm.AccessDesc) uint32 {
	for i, x := range l.lists {
		if sameAccess(x, list) {
			return uint32(i)
		}
	}
	l.lists = append(l.lists, append([]vmm.AccessDesc(nil), list...))
	return uint32(len(l.lists) - 1)
}

func sameAccess(a, b []vmm.AccessDesc) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// appendMerged appends to out the list old with set applied: set's entries
// replace old's for the same device, and AccessNone removes the device.
func appendMerged(out, old, set []vmm.AccessDesc) []vmm.AccessDesc {
	for _, o := range old {
		keep := true
		for _, s := range set {
			if s.Device == o.Device {
				keep = false
			}
		}
		if keep {
			out = append(out, o)
		}
	}
	for _, s := range set {
		if s.Flags != vmm.AccessNone {
			out = append(out, s)
		}
	}
	return out
}
