package xseg

import (
	"fmt"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/vmm"
)

// Choice is the allocator Open makes for a device, and why.
type Choice struct {
	// Allocator is AllocatorExpandable or AllocatorFallback.
	Allocator AllocatorKind `json:"allocator"`
	// Reason says why, in a sentence fragment for people.
	Reason string `json:"reason"`
}

// ChooseAllocator says which allocator Open makes on device dev of d when
// Options.Allocator is kind. AllocatorAuto (or "") picks expandable where
// the device supports virtual memory management (vmm.DeviceInfo.VMM) and
// fallback where it does not; AllocatorExpandable and AllocatorFallback
// force one. Forcing expandable on a device without VMM fails with an
// error matching vmm.ErrNotSupported, an unknown kind with vmm.ErrInvalid.
// It is safe for concurrent use if d is.
func ChooseAllocator(d vmm.Driver, dev vmm.Device, kind AllocatorKind) (Choice, error) {
	if err := kind.check(); err != nil {
		return Choice{}, err
	}
	if kind == AllocatorFallback {
		return Choice{AllocatorFallback, "asked for (it needs only plain allocations, which every device has)"}, nil
	}
	info, err := d.DeviceInfo(dev)
	if err != nil {
		return Choice{}, fmt.Errorf("xseg: device %d: %w", dev, err)
	}
	what := fmt.Sprintf("device %d (%s) of the %s backend", dev, info.Name, d.Backend())
	switch {
	case kind == AllocatorExpandable && !info.VMM:
		return Choice{}, fmt.Errorf("xseg: the expandable allocator was asked for, but %s has no virtual memory management: %w", what, vmm.ErrNotSupported)
	case kind == AllocatorExpandable:
		return Choice{AllocatorExpandable, "asked for; " + what + " supports virtual memory management"}, nil
	case info.VMM:
		return Choice{AllocatorExpandable, "auto: " + what + " supports virtual memory management"}, nil
	}
	return Choice{AllocatorFallback, "auto: " + what + " has no virtual memory management, so segments are plain allocations"}, nil
}

// Kind names the xseg allocator a is: AllocatorExpandable,
// AllocatorFallback, or "" for an Allocator of another package.
func Kind(a Allocator) AllocatorKind {
	switch a := a.(type) {
	case *DeviceAllocator:
		return a.Kind()
	case *expandable.Allocator:
		return AllocatorExpandable
	case *fallback.Allocator:
		return AllocatorFallback
	}
	return ""
}
