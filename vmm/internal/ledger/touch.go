package ledger

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Span is device memory that work (a copy, a memset) touches and the
// access it needs.
type Span struct {
	Ptr  vmm.DevicePtr
	N    uint64
	Want vmm.Access
}

// InAlloc reports whether s lies inside one plain allocation (MemAlloc, or
// one opened through IPC), which every device may use.
func (l *Ledger) InAlloc(s Span) bool {
	base, size, ok := l.AllocAt(s.Ptr)
	return ok && checkWrap(s) == nil && s.Ptr.Add(s.N) <= base.Add(size)
}

// checkWrap reports vmm.ErrInvalid for a span that runs past the end of
// the address space: its end wraps around to a low address, which every
// check of "inside" would otherwise pass.
func checkWrap(s Span) error {
	if s.Ptr.Add(s.N) < s.Ptr {
		return fmt.Errorf("%d bytes at %v: wraps around the address space: %w", s.N, s.Ptr, vmm.ErrInvalid)
	}
	return nil
}

// needsAccess reports whether work on s must be checked against a
// mapping's access: not for an empty span or one in a plain allocation.
func (l *Ledger) needsAccess(s Span) bool { return s.N != 0 && !l.InAlloc(s) }

// May reports vmm.ErrInvalid unless dev may touch every span.
func (l *Ledger) May(dev vmm.Device, spans ...Span) error {
	for _, s := range spans {
		if err := checkWrap(s); err != nil {
			return err
		}
		if !l.needsAccess(s) {
			continue
		}
		if err := l.Accessible(s.Ptr, s.N, dev, s.Want); err != nil {
			return err
		}
	}
	return nil
}

// Toucher picks a device that may touch every span, trying the devices of
// the mappings at the spans' starts (each mapping's own device first,
// then those granted access) in order. found is false, with no error,
// when no span needs a device (all empty or in plain allocations). An
// address that is neither mapped nor allocated, or spans no one device may
// touch, are vmm.ErrInvalid: touching them would fault the device.
func (l *Ledger) Toucher(what string, spans ...Span) (dev vmm.Device, found bool, err error) {
	var cands []vmm.Device
	for _, s := range spans {
		if err := checkWrap(s); err != nil {
			return 0, false, fmt.Errorf("%s: %w", what, err)
		}
		if !l.needsAccess(s) {
			continue
		}
		m, ok := l.Lookup(s.Ptr)
		if !ok {
			return 0, false, fmt.Errorf("%s: address %v is neither mapped nor allocated here: %w", what, s.Ptr, vmm.ErrInvalid)
		}
		cands = append(cands, m.Device)
		for _, a := range m.Access {
			cands = append(cands, a.Device)
		}
	}
	if len(cands) == 0 {
		return 0, false, nil
	}
	var first error
	for _, dev := range cands {
		err := l.May(dev, spans...)
		if err == nil {
			return dev, true, nil
		}
		if first == nil {
			first = err
		}
	}
	return 0, false, fmt.Errorf("%s: no one device may touch it all (grant peer access with SetAccess): %w", what, first)
}
