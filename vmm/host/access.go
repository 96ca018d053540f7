package host

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// SetAccess grants the listed devices access to [ptr, ptr+size), which
// mappings must cover entirely: mapped -> accessible (or back to mapped when
// every device is left with AccessNone). The host has one protection for all
// devices: a mapping is PROT_READ|PROT_WRITE if any device may write it,
// PROT_READ if any may read it, PROT_NONE otherwise. Adjacent mappings that
// end up with the same protection take one mprotect. If an mprotect fails,
// the runs already changed get their old protection back and the ledger its
// old access, so the range is as before the call.
func (d *Driver) SetAccess(ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	for _, a := range access {
		if err := d.checkDevice(a.Device); err != nil {
			return fmt.Errorf("setting access at %v: %w", ptr, err)
		}
	}
	d.prot.Lock()
	defer d.prot.Unlock()
	old, err := d.books.SetAccess(ptr, size, access)
	if err != nil {
		return err
	}
	now := make([]ledger.Mapping, len(old))
	for i, m := range old {
		now[i], _ = d.books.Lookup(m.Ptr) // present: prot is held
	}
	done, err := protect(now)
	if err == nil {
		return nil
	}
	_, rerr := protect(old[:done])
	d.books.UndoAccess(old)
	return fmt.Errorf("setting access at %v+%d: %w", ptr, size, errors.Join(sysErr(err), rerr))
}

// protect gives each of ms, adjacent mappings in address order, the
// protection of its access, one mprotect per run of equal protection. It
// returns how many mappings it changed before an error.
func protect(ms []ledger.Mapping) (int, error) {
	for i := 0; i < len(ms); {
		prot := protOf(ms[i].Access)
		j, size := i, uint64(0)
		for ; j < len(ms) && protOf(ms[j].Access) == prot; j++ {
			size += ms[j].Size
		}
		if err := mprotect(uintptr(ms[i].Ptr), size, prot); err != nil {
			return i, err
		}
		i = j
	}
	return len(ms), nil
}
