// Package pagerun maps a run of physical pages into reserved address space
// and unwinds it. The expandable allocator's pages, expandable.Buffer and
// ipc's mappings all map their runs with MapFrom: it takes (creates,
// imports) every page of the run before it maps the first, maps them one
// Map a page (MapSpans: one Map an allocation of several pages, for ipc's
// imports), grants access with one SetAccess, and on failure unmaps what
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
	return MapSpans(d, ptr, ps, nil, run, access, src)
}

// MapSpans is MapFrom for a run of allocations that may hold several pages
// each: run[i] holds spans[i] pages of ps (nil spans: one page each, as
// MapFrom) and is mapped whole, with one Map call, right after the
// allocations before it. Everything else is as MapFrom, counted in
// allocations: left is how many of run stay mapped, to be unmapped later
// with UnmapSpans and the same spans.
func MapSpans(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, spans []int, run []vmm.Handle, access []vmm.AccessDesc, src Source) (left int, err error) {
	for i := range run {
		h, err := src.Take(i)
		if err != nil {
			return 0, errors.Join(err, src.Give(run[:i]))
		}
		run[i] = h
	}
	left, err = mapRun(d, ptr, ps, spans, run, access)
	if err != nil {
		return left, errors.Join(err, src.Give(run[left:]))
	}
	return left, nil
}

// runBytes is the size of the first n allocations of a run: n pages of ps
// without spans, else the pages of spans[:n].
func runBytes(ps uint64, spans []int, n int) uint64 {
	if spans == nil {
		return uint64(n) * ps
	}
	var pages uint64
	for _, s := range spans[:n] {
		pages += uint64(s)
	}
	return pages * ps
}

// unit names what a run counts: pages, or allocations where they have
// spans.
func unit(spans []int) string {
	if spans == nil {
		return "page"
	}
	return "allocation"
}

// mapRun maps hs[i] whole at ptr plus the bytes before it, one Map call an
// allocation (a page without spans), then grants access to the whole run
// with one SetAccess. It returns len(hs) and nil when all is done. On
// failure it unmaps what it mapped (one Unmap call) and returns the error
// with the allocations from ptr still mapped.
func mapRun(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, spans []int, hs []vmm.Handle, access []vmm.AccessDesc) (int, error) {
	var off uint64
	for i, h := range hs {
		at, size := ptr.Add(off), ps
		if spans != nil {
			size = uint64(spans[i]) * ps
		}
		if err := d.Map(at, size, h, 0); err != nil {
			return undo(d, ptr, ps, spans, i, fmt.Errorf("mapping %s %d of %d at %v: %w", unit(spans), i+1, len(hs), at, err))
		}
		off += size
	}
	if err := d.SetAccess(ptr, off, access); err != nil {
		return undo(d, ptr, ps, spans, len(hs), fmt.Errorf("setting access to %d %ss at %v: %w", len(hs), unit(spans), ptr, err))
	}
	return len(hs), nil
}

// undo unmaps the n allocations mapRun mapped before err, and returns how
// many stay mapped with the errors.
func undo(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, spans []int, n int, err error) (int, error) {
	if uerr := UnmapSpans(d, ptr, ps, spans, n); uerr != nil {
		return n, errors.Join(err, fmt.Errorf("undoing the mapping (%d %ss stay mapped): %w", n, unit(spans), uerr))
	}
	return 0, err
}

// Unmap unmaps the n pages at ptr with one call: a failed call leaves all
// of them mapped, so the caller's books need no partial state.
func Unmap(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, n int) error {
	return UnmapSpans(d, ptr, ps, nil, n)
}

// UnmapSpans unmaps the first n allocations of spans (nil: pages) at ptr
// with one call, as Unmap.
func UnmapSpans(d vmm.Driver, ptr vmm.DevicePtr, ps uint64, spans []int, n int) error {
	if n == 0 {
		return nil
	}
	if err := d.Unmap(ptr, runBytes(ps, spans, n)); err != nil {
		return fmt.Errorf("unmapping %d %ss at %v: %w", n, unit(spans), ptr, err)
	}
	return nil
}
