// Package pagerun maps a run of physical pages into reserved address space
// and unwinds it. The expandable allocator's pages, expandable.Buffer and
// ipc's mappings all map their runs with MapFrom: it takes (creates,
// imports) every page of the run before it maps the first, maps them one
// Map a page, grants access with one SetAccess, and on failure unmaps what
// it mapped and gives back what it took. Doing it in one place keeps what
// a failed undo leaves behind the same for all three: the pages stay
// mapped, the caller is told how many, and it keeps them in its books to
// unmap later (Unmap).
package pagerun

import (
	"errors"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// A Source supplies the pages of a run and takes back those a failed run
// did not leave mapped.
type Source struct {
	// Take returns page i of the run: a cached page, a new one, an
	// imported one.
	Take func(i int) (vmm.Handle, error)
	// Give takes back pages that Take returned and that are not mapped:
	// those taken before a Take failed, or those after the pages a failed
	// undo left mapped. It may zero their places in hs (MapFrom does not
	// look at them again), and keeps in its own books what it could not
	// give back.
	Give func(hs []vmm.Handle) error
}

// MapFrom fills run (one entry a page, from ptr) with src.Take, every page
// before mapping the first (as PyTorch's expandable segments do: the
// driver is quicker with a run of like calls than with takes and maps
// taking turns), then maps them (one Map a page, one SetAccess for the run). It returns len(run) and nil
// when all is done.
//
// If Take fails for page i, the pages taken before it go to src.Give and
// MapFrom returns 0 with the errors; nothing was mapped. If Map fails, the
// pages it left mapped are run[:left]: none, or, when the undo (one Unmap)
// failed as well, every page it had mapped. The caller keeps owning those:
// they must not be given back or released, only unmapped later (Unmap),
// for the driver holds them at those addresses. run[left:] go to src.Give.
func MapFrom(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, run []vmm.Handle, access []vmm.AccessDesc, src Source) (left int, err error) {
	for i := range run {
		h, err := src.Take(i)
		if err != nil {
			return 0, errors.Join(err, src.Give(run[:i]))
		}
		run[i] = h
	}
	left, err = mapRun(d, ptr, ps, run, access)
	if err != nil {
		return left, errors.Join(err, src.Give(run[left:]))
	}
	return left, nil
}

// mapRun maps hs[i] at ptr+i*ps, one Map call a page, then grants access
// to the whole run with one SetAccess. It returns len(hs) and nil when all
// is done. On failure it unmaps the pages it mapped (one Unmap call) and
// returns the error with the pages from ptr still mapped.
func mapRun(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, hs []vmm.Handle, access []vmm.AccessDesc) (int, error) {
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

// undo unmaps the n pages mapRun mapped before err, and returns how many stay
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
