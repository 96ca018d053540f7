package main

import (
	"encoding/json"
	"errors"
	"fmt"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// malloc returns a block of size bytes on dev for use on stream s. A size
// of 0 returns 0 and no error, as PyTorch's own allocator does.
func (l *library) malloc(size int64, dev int, s vmm.Stream) (vmm.DevicePtr, error) {
	p, _, err := l.mallocReusable(size, dev, s)
	return p, err
}

// mallocReusable is malloc that also reports whether the free queue may
// take the block back (DeviceAllocator.AllocReusable; freequeue.go).
func (l *library) mallocReusable(size int64, dev int, s vmm.Stream) (vmm.DevicePtr, bool, error) {
	if size <= 0 {
		if size == 0 {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("negative size %d: %w", size, vmm.ErrInvalid)
	}
	a, err := l.allocator(dev)
	if err != nil {
		return 0, false, err
	}
	return a.AllocReusable(uint64(size), s)
}

// free gives back a block of dev. Freeing 0 does nothing; freeing a pointer
// the allocator does not know is an error that changes nothing.
func (l *library) free(ptr vmm.DevicePtr, dev int) error {
	if ptr == 0 {
		return nil
	}
	a, err := l.existing(dev)
	if err != nil {
		return err
	}
	if a == nil {
		return fmt.Errorf("freeing %v: device %d has no allocations: %w", ptr, dev, vmm.ErrInvalid)
	}
	return a.Free(ptr)
}

// recordStream marks the block at ptr as used on stream s too. The block
// may belong to any device's allocator. known is false when no allocator
// has a block at ptr (memory from elsewhere: another allocator, an import);
// err is then nil. Any other failure is err.
func (l *library) recordStream(ptr vmm.DevicePtr, s vmm.Stream) (known bool, err error) {
	if ptr == 0 {
		return false, nil
	}
	for dev := range maxDevices {
		d := l.devs[dev].Load()
		if d == nil {
			continue
		}
		err := d.a.RecordStream(ptr, s)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, spec.ErrNotAllocated) {
			return true, err // ptr is this device's: the stream is bad, or the allocator closed
		}
	}
	return false, nil
}

// each calls fn for dev's allocator, or for every allocator made so far when
// dev is -1. A device without an allocator has nothing to do; a device the
// backend does not have is an error, as in the calls that read a device.
func (l *library) each(dev int, fn func(*xseg.DeviceAllocator) error) error {
	if dev != -1 {
		a, err := l.known(dev)
		if err != nil || a == nil {
			return err
		}
		return fn(a)
	}
	var errs []error
	for i := range maxDevices {
		if d := l.devs[i].Load(); d != nil {
			if err := fn(d.a); err != nil {
				errs = append(errs, fmt.Errorf("device %d: %w", i, err))
			}
		}
	}
	return errors.Join(errs...)
}

// dropKeptImports drops the mappings of other processes' blocks that the
// library's importer keeps; share.go (cgo: the C API) sets it.
var dropKeptImports = func() error { return nil }

// emptyCache gives every whole free page of dev (-1: every device) back to
// the driver, after the mappings of other processes' blocks the importer
// keeps (every device's: they may hold memory their exporter released).
func (l *library) emptyCache(dev int) error {
	err := dropKeptImports()
	return errors.Join(err, l.each(dev, func(a *xseg.DeviceAllocator) error { return a.EmptyCache() }))
}

// emptyCacheHook is emptyCache(-1) for PyTorch's reset hook
// (torch.cuda.empty_cache): a device with a CUDA graph capture underway
// keeps its cache, and while one is the kept imports stay too (nothing may
// wait or unmap while a capture records), instead of the call failing, as
// PyTorch's own allocator does not fail there. The other devices are
// emptied.
func (l *library) emptyCacheHook() error {
	capturing := false
	err := l.each(-1, func(a *xseg.DeviceAllocator) error {
		err := a.EmptyCache()
		if errors.Is(err, xseg.ErrCapturing) {
			capturing = true
			return nil
		}
		return err
	})
	if capturing {
		l.log.Debug("xseg: empty_cache during a CUDA graph capture: the capturing device keeps its cache")
		return err
	}
	return errors.Join(dropKeptImports(), err)
}

// resetPeakStats makes every peak of dev (-1: every device) the current
// value.
func (l *library) resetPeakStats(dev int) error {
	return l.each(dev, func(a *xseg.DeviceAllocator) error { a.ResetPeakStats(); return nil })
}

// resetAccumulatedStats zeroes the accumulated statistics of dev (-1:
// every device).
func (l *library) resetAccumulatedStats(dev int) error {
	return l.each(dev, func(a *xseg.DeviceAllocator) error { a.ResetAccumulatedStats(); return nil })
}

// known is existing, but once the driver is open a device it does not
// have is an error too.
func (l *library) known(dev int) (*xseg.DeviceAllocator, error) {
	a, err := l.existing(dev)
	if err != nil || a != nil {
		return a, err
	}
	if drv := l.driver(); drv != nil {
		n, err := drv.DeviceCount()
		if err != nil {
			return nil, fmt.Errorf("counting devices: %w", err)
		}
		if dev >= n {
			return nil, fmt.Errorf("device %d: the %s backend has %d devices: %w", dev, drv.Backend(), n, vmm.ErrInvalid)
		}
	}
	return nil, nil
}

// statsReport is the JSON of xseg_stats_json: the allocator's statistics
// with PyTorch's names, and the device's memory as the driver reports it
// (zero before the library has started).
type statsReport struct {
	xseg.Stats
	Device      int    `json:"device"`
	DeviceTotal uint64 `json:"device_total_bytes"`
	DeviceFree  uint64 `json:"device_free_bytes"`
}

// statsJSON is dev's statistics as JSON; all zero for a device without an
// allocator yet.
func (l *library) statsJSON(dev int) ([]byte, error) {
	a, err := l.known(dev)
	if err != nil {
		return nil, err
	}
	r := statsReport{Device: dev}
	if a != nil {
		r.Stats = a.Stats()
	}
	if drv := l.driver(); drv != nil {
		if r.DeviceFree, r.DeviceTotal, err = drv.MemInfo(vmm.Device(dev)); err != nil {
			return nil, fmt.Errorf("memory of device %d: %w", dev, err)
		}
	}
	return json.Marshal(r)
}

// snapshotJSON is dev's snapshot as JSON; no segments for a device without
// an allocator yet.
func (l *library) snapshotJSON(dev int) ([]byte, error) {
	a, err := l.known(dev)
	if err != nil {
		return nil, err
	}
	var snap xseg.Snapshot
	if a != nil {
		snap = a.Snapshot()
	}
	if snap.Segments == nil {
		snap.Segments = []spec.Segment{}
	}
	return json.Marshal(snap)
}
