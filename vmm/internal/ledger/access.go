package ledger

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// AccessUndo is what RestoreAccess needs to undo a GrantAccess: the
// access the mappings of [Ptr, End) had before, as runs of mappings that
// had the same. It is a value; the common case, a run whose mappings all
// had the same access, needs no allocation.
type AccessUndo struct {
	first accessRun
	more  []accessRun
}

// accessRun is [ptr, end), whose mappings all had access.
type accessRun struct {
	ptr, end vmm.DevicePtr
	access   []vmm.AccessDesc
}

// checkAccess refuses unknown access flags and an empty list.
func checkAccess(ptr vmm.DevicePtr, access []vmm.AccessDesc) error {
	for _, a := range access {
		if a.Flags != vmm.AccessNone && a.Flags != vmm.AccessRead && a.Flags != vmm.AccessReadWrite {
			return fmt.Errorf("setting access at %v: unknown access flags %#x: %w", ptr, uint32(a.Flags), vmm.ErrInvalid)
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
	l.mu.Lock()
	defer l.mu.Unlock()
	ms, err := l.covering("setting access", ptr, size)
	if err != nil {
		return AccessUndo{}, err
	}
	var u AccessUndo
	cur := &u.first
	var lastNew []vmm.AccessDesc
	for i, m := range ms {
		if i == 0 || !sameAccess(m.Access, cur.access) {
			if i > 0 {
				u.more = append(u.more, accessRun{ptr: m.Ptr, access: m.Access})
				cur = &u.more[len(u.more)-1]
			} else {
				*cur = accessRun{ptr: m.Ptr, access: m.Access}
			}
			lastNew = l.merge(m.Access, access)
		}
		cur.end = m.end()
		m.Access = lastNew
	}
	return u, nil
}

// RestoreAccess puts back the access a GrantAccess changed.
func (l *Ledger) RestoreAccess(u AccessUndo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.restoreRun(u.first)
	for _, r := range u.more {
		l.restoreRun(r)
	}
}

func (l *Ledger) restoreRun(r accessRun) {
	lo, hi := l.keys(r.ptr, r.end)
	l.maps.AscendRange(lo, hi, func(m *Mapping) bool {
		m.Access = r.access
		return true
	})
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
	ms, err := l.covering("setting access", ptr, size)
	if err != nil {
		return nil, err
	}
	// The mappings of a run usually share their access: merge once for
	// each distinct old value, and share the merged slice (never mutated).
	old := make([]Mapping, len(ms))
	var lastOld, lastNew []vmm.AccessDesc
	for i, m := range ms {
		old[i] = *m
		if i == 0 || !sameAccess(m.Access, lastOld) {
			lastOld, lastNew = m.Access, l.merge(m.Access, access)
		}
		m.Access = lastNew
	}
	return old, nil
}

// merge returns old with set applied, sharing old or the list granted last
// where one of them is equal to the result.
func (l *Ledger) merge(old, set []vmm.AccessDesc) []vmm.AccessDesc {
	if len(set) == 1 {
		// The common case: one device's access, no allocation needed to
		// tell whether it changes anything.
		s := set[0]
		if len(old) == 0 && s.Flags != vmm.AccessNone && sameAccess(l.granted, set) {
			return l.granted
		}
		if len(old) == 1 && old[0] == s {
			return old
		}
	}
	m := mergeAccess(old, set)
	if sameAccess(m, old) && old != nil {
		return old
	}
	if sameAccess(m, l.granted) && l.granted != nil {
		return l.granted
	}
	l.granted = m
	return m
}

// UndoAccess restores the access of mappings SetAccess changed.
func (l *Ledger) UndoAccess(ms []Mapping) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range ms {
		if m := l.mappingAt(o.Ptr); m != nil && m.Ptr == o.Ptr {
			m.Access = o.Access
		}
	}
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

func mergeAccess(old, set []vmm.AccessDesc) []vmm.AccessDesc {
	out := make([]vmm.AccessDesc, 0, len(old)+len(set))
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
