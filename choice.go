package xseg

import (
	"fmt"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/vmm"
)

// Choice is the allocator Open makes for a device, and why.
type Choice struct {
	// Allocator is "expandable" or "fallback".
	Allocator string `json:"allocator"`
	// Reason says why, in a sentence fragment for people.
	Reason string `json:"reason"`
}

// ChooseAllocator says which allocator Open makes on device dev of d when
// Options.Allocator is name. "auto" (or "") picks expandable where the
// device supports virtual memory management (vmm.DeviceInfo.VMM) and
// fallback where it does not; "expandable" and "fallback" force one.
// Forcing expandable on a device without VMM fails with an error matching
// vmm.ErrNotSupported, an unknown name with vmm.ErrInvalid. It is safe for
// concurrent use if d is.
func ChooseAllocator(d vmm.Driver, dev vmm.Device, name string) (Choice, error) {
	switch name {
	case "", "auto", "expandable", "fallback":
	default:
		return Choice{}, fmt.Errorf("xseg: unknown allocator %q (want auto, expandable or fallback): %w", name, vmm.ErrInvalid)
	}
	if name == "fallback" {
		return Choice{"fallback", "asked for (it needs only plain allocations, which every device has)"}, nil
	}
	info, err := d.DeviceInfo(dev)
	if err != nil {
		return Choice{}, fmt.Errorf("xseg: device %d: %w", dev, err)
	}
	what := fmt.Sprintf("device %d (%s) of the %s backend", dev, info.Name, d.Backend())
	switch {
	case name == "expandable" && !info.VMM:
		return Choice{}, fmt.Errorf("xseg: the expandable allocator was asked for, but %s has no virtual memory management: %w", what, vmm.ErrNotSupported)
	case name == "expandable":
		return Choice{"expandable", "asked for; " + what + " supports virtual memory management"}, nil
	case info.VMM:
		return Choice{"expandable", "auto: " + what + " supports virtual memory management"}, nil
	}
	return Choice{"fallback", "auto: " + what + " has no virtual memory management, so segments are plain allocations"}, nil
}

// Kind names the xseg allocator a is: "expandable", "fallback", or ""
// for an Allocator of another package.
func Kind(a Allocator) string {
	if o, ok := a.(*owning); ok {
		a = o.Allocator
	}
	switch a.(type) {
	case *expandable.Allocator:
		return "expandable"
	case *fallback.Allocator:
		return "fallback"
	}
	return ""
}
