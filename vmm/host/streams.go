package host

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Streams and events of the host backend are bookkeeping only: every
// operation is synchronous, so all work queued on a stream has finished when
// the call that queued it returns, and an event is complete as soon as it
// exists. They are still validated, so a stream or event destroyed twice, or
// used after destruction, is vmm.ErrInvalid as on a GPU. Stream 0, the
// default stream, is always valid and cannot be destroyed.

// StreamCreate makes a stream on dev.
func (d *Driver) StreamCreate(dev vmm.Device) (vmm.Stream, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	if err := d.checkDevice(dev); err != nil {
		return 0, fmt.Errorf("creating a stream: %w", err)
	}
	d.mu.Lock()
	d.mu.nextStream++
	s := d.mu.nextStream
	d.mu.Unlock()
	d.books.AddStream(s, dev)
	return s, nil
}

// StreamDestroy destroys a stream made by StreamCreate.
func (d *Driver) StreamDestroy(s vmm.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	_, err := d.books.RemoveStream(s)
	return err
}

// StreamSynchronize returns at once for a live stream: nothing is ever
// pending.
func (d *Driver) StreamSynchronize(s vmm.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	return d.checkStream(s)
}

// DeviceSynchronize returns at once for a valid device: nothing is ever
// pending.
func (d *Driver) DeviceSynchronize(dev vmm.Device) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	if err := d.checkDevice(dev); err != nil {
		return fmt.Errorf("synchronizing: %w", err)
	}
	return nil
}

func (d *Driver) checkStream(s vmm.Stream) error {
	if s == 0 {
		return nil
	}
	_, err := d.books.StreamDevice(s)
	return err
}

// EventCreate makes an event on dev.
func (d *Driver) EventCreate(dev vmm.Device) (vmm.Event, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.life.RUnlock()
	if err := d.checkDevice(dev); err != nil {
		return 0, fmt.Errorf("creating an event: %w", err)
	}
	d.mu.Lock()
	d.mu.nextEvent++
	e := d.mu.nextEvent
	d.mu.Unlock()
	d.books.AddEvent(e, dev)
	return e, nil
}

// EventRecord records live event e on live stream s; e is complete at once.
// A stream made by StreamCreate must be on e's device (vmm.ErrInvalid
// otherwise, as on the CUDA backend); stream 0 serves every device.
func (d *Driver) EventRecord(e vmm.Event, s vmm.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	dev, err := d.books.EventDevice(e)
	if err != nil {
		return fmt.Errorf("recording: %w", err)
	}
	if s == 0 {
		return nil
	}
	sdev, err := d.books.StreamDevice(s)
	if err != nil {
		return fmt.Errorf("recording event %#x: %w", uintptr(e), err)
	}
	if sdev != dev {
		return fmt.Errorf("recording event %#x of device %d on stream %#x of device %d: %w", uintptr(e), dev, uintptr(s), sdev, vmm.ErrInvalid)
	}
	return nil
}

// EventQuery reports true for every live event.
func (d *Driver) EventQuery(e vmm.Event) (bool, error) {
	if err := d.enter(); err != nil {
		return false, err
	}
	defer d.life.RUnlock()
	if _, err := d.books.EventDevice(e); err != nil {
		return false, fmt.Errorf("querying: %w", err)
	}
	return true, nil
}

// EventSynchronize returns at once for a live event.
func (d *Driver) EventSynchronize(e vmm.Event) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	if _, err := d.books.EventDevice(e); err != nil {
		return fmt.Errorf("synchronizing: %w", err)
	}
	return nil
}

// EventDestroy destroys a live event.
func (d *Driver) EventDestroy(e vmm.Event) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.life.RUnlock()
	_, err := d.books.RemoveEvent(e)
	return err
}
