// Package pagerun maps a run of physical pages into reserved address space
// and unwinds it. The expandable allocator's pages, expandable.Buffer and
// ipc's mappings all do this; doing it in one place keeps what a failed
// undo leaves behind the same for all three: the pages stay mapped, the
// caller is told how many, and it keeps them in its books to unmap later.
package pagerun

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Map maps hs[i] at ptr+i*ps, one Map call a page, then grants access to
// the whole run with one SetAccess. It returns len(hs) and nil when all is
// done. On failure it unmaps the pages it mapped (one Unmap call) and
// returns the error with the pages from ptr still mapped: 0, or, when the
// undo failed as well, every page it had mapped. The caller keeps owning
// the handles either way; those still mapped must not be released, only
// unmapped later (Unmap), for the driver holds them at those addresses.
func Map(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, hs []vmm.Handle, access []vmm.AccessDesc) (int, error) {
	for i, h := range hs {
		at := ptr.Add(uint64(i) * ps)
		if err := d.Map(at, ps, h, 0); err != nil {
			return undo(d, ptr, ps, i, fmt.Errorf("mapping page %d of %d at %v: %w", i+1, len(hs), at, err))
		}
	}
	if err := d.SetAccess(ptr, uint64(len(hs))*ps, access); err != nil {
		return undo(d, ptr, ps, len(hs), fmt.Errorf("setting access to %d pages at %v: %w", len(hs), ptr, err))
	}
	return len(hs), nil
}

// undo unmaps the n pages Map mapped before err, and returns how many stay
// mapped with the errors.
func undo(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, n int, err error) (int, error) {
	if uerr := Unmap(d, ptr, ps, n); uerr != nil {
		return n, errors.Join(err, fmt.Errorf("undoing the mapping (%d pages stay mapped): %w", n, uerr))
	}
	return 0, err
}

// Unmap unmaps the n pages at ptr with one call: a failed call leaves all
// of them mapped, so the caller's books need no partial state.
func Unmap(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, n int) error {
	if n == 0 {
		return nil
	}
	if err := d.Unmap(ptr, uint64(n)*ps); err != nil {
		return fmt.Errorf("unmapping %d pages at %v: %w", n, ptr, err)
	}
	return nil
}
