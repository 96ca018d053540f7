package xseg

import (
	"errors"
	"fmt"
	"os"

	"github.com/xseg-dev/xseg/vmm"
)

// PeerAccessor is implemented by allocators whose memory other devices can
// be granted access to (the expandable allocator). EnablePeerAccess grants
// device peer read-write access to every page mapped now and every page
// mapped later; DisablePeerAccess takes it back. Both are idempotent.
type PeerAccessor interface {
	EnablePeerAccess(peer vmm.Device) error
	DisablePeerAccess(peer vmm.Device) error
}

// Devices is one allocator for each device of a driver, as a process that
// uses several GPUs needs: For picks a device's allocator, EnablePeerAccess
// lets one device reach another's memory, Copy moves bytes between them.
// Every allocator shares the one driver. Devices is safe for concurrent
// use; Close must not run concurrently with the other methods.
type Devices struct {
	d      vmm.Driver
	owned  bool // Close closes d
	allocs []*DeviceAllocator
	// closed is set by Close; left holds the allocators whose Close
	// failed, which the next Close tries again.
	closed bool
	left   []*DeviceAllocator
}

// OpenDevices makes an allocator for every device of the driver, each as
// Open(o) would make it for that device (o.Device is ignored). If o.Driver
// is nil it opens the backend o.Backend names and closes it on Close. If
// making one device's allocator fails, those made are closed and the error
// names the device.
func OpenDevices(o Options) (*Devices, error) {
	if o.Config == nil {
		cfg, err := ConfigFromEnv(os.Getenv)
		if err != nil {
			return nil, fmt.Errorf("xseg: %w", err)
		}
		o.Config = &cfg
	}
	ds := &Devices{d: o.Driver}
	if ds.d == nil {
		d, err := OpenDriver(o.Backend, o.HostCapacity)
		if err != nil {
			return nil, err
		}
		ds.d, ds.owned = d, true
	}
	n, err := ds.d.DeviceCount()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("xseg: counting devices: %w", err), ds.closeDriver())
	}
	for dev := range vmm.Device(n) {
		one := o
		one.Driver, one.Device = ds.d, dev
		a, err := Open(one)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("xseg: device %d of %d: %w", dev, n, err), ds.Close())
		}
		ds.allocs = append(ds.allocs, a)
	}
	return ds, nil
}

// Driver is the driver the allocators share.
func (ds *Devices) Driver() vmm.Driver { return ds.d }

// Count is the number of devices, one allocator each.
func (ds *Devices) Count() int { return len(ds.allocs) }

// For returns the allocator of device dev, nil for a device the driver
// does not have and after Close.
func (ds *Devices) For(dev vmm.Device) *DeviceAllocator {
	if dev < 0 || int(dev) >= len(ds.allocs) {
		return nil
	}
	return ds.allocs[dev]
}

// peers returns owner's allocator, after checking both devices.
func (ds *Devices) peers(owner, peer vmm.Device) (*DeviceAllocator, error) {
	if ds.closed {
		return nil, fmt.Errorf("xseg: peer access of device %d to device %d: %w", peer, owner, vmm.ErrClosed)
	}
	for _, dev := range []vmm.Device{owner, peer} {
		if ds.For(dev) == nil {
			return nil, fmt.Errorf("xseg: peer access of device %d to device %d: no device %d (there are %d): %w", peer, owner, dev, len(ds.allocs), vmm.ErrInvalid)
		}
	}
	return ds.For(owner), nil
}

// EnablePeerAccess grants device peer read-write access to all memory of
// owner's allocator, mapped now or later (see PeerAccessor). It is
// one-way: call it again with the devices swapped for the other direction.
// A fallback allocator cannot grant it (vmm.ErrNotSupported).
func (ds *Devices) EnablePeerAccess(owner, peer vmm.Device) error {
	a, err := ds.peers(owner, peer)
	if err != nil {
		return err
	}
	return a.EnablePeerAccess(peer)
}

// DisablePeerAccess revokes what EnablePeerAccess(owner, peer) granted.
func (ds *Devices) DisablePeerAccess(owner, peer vmm.Device) error {
	a, err := ds.peers(owner, peer)
	if err != nil {
		return err
	}
	return a.DisablePeerAccess(peer)
}

// Copy copies n bytes from src to dst, blocks of any of the devices, and
// waits. Between two devices' memory one device must reach both: grant it
// with EnablePeerAccess first, else the copy fails with vmm.ErrInvalid.
func (ds *Devices) Copy(dst, src vmm.DevicePtr, n uint64) error {
	if err := ds.d.CopyDtoD(dst, src, n); err != nil {
		return fmt.Errorf("xseg: copying %d bytes from %v to %v: %w", n, src, dst, err)
	}
	return nil
}

// Close closes every allocator, then the driver if OpenDevices opened it.
// Blocks still allocated become invalid. If an allocator fails to give
// everything back to a driver OpenDevices did not open, Close returns the
// error and the next Close tries that allocator again (see Allocator);
// once a Close has returned nil, later ones return nil too. After Close,
// For returns nil and peer access fails with vmm.ErrClosed.
func (ds *Devices) Close() error {
	if !ds.closed {
		ds.closed, ds.left, ds.allocs = true, ds.allocs, nil
	}
	var errs []error
	left := ds.left[:0]
	for _, a := range ds.left {
		if err := a.Close(); err != nil {
			errs = append(errs, fmt.Errorf("xseg: closing device %d's allocator: %w", a.Device(), err))
			left = append(left, a)
		}
	}
	clear(ds.left[len(left):])
	ds.left = left
	if ds.owned {
		// Closing the driver gives back what the allocators kept.
		ds.left = nil
	}
	errs = append(errs, ds.closeDriver())
	return errors.Join(errs...)
}

func (ds *Devices) closeDriver() error {
	if !ds.owned {
		return nil
	}
	ds.owned = false
	return ds.d.Close()
}
