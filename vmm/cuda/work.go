package cuda

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// StreamCreate makes a non-blocking stream in dev's primary context.
func (d *Driver) StreamCreate(dev vmm.Device) (vmm.Stream, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	st, err := d.sym.streamCreate(s.ctx)
	if err != nil {
		return 0, fmt.Errorf("cuStreamCreate on device %d: %w", dev, err)
	}
	d.buried(st, true)
	d.books.AddStream(st, dev)
	return st, nil
}

// StreamDestroy destroys a stream made by StreamCreate.
func (d *Driver) StreamDestroy(st vmm.Stream) error {
	if err := d.live(); err != nil {
		return err
	}
	dev, err := d.books.RemoveStream(st)
	if err != nil {
		return err
	}
	if err := d.sym.streamDestroy(d.devs[dev].Load().ctx, st); err != nil {
		d.books.AddStream(st, dev)
		return fmt.Errorf("cuStreamDestroy %#x: %w", uintptr(st), err)
	}
	d.buried(st, false)
	return nil
}

// streamCtx is the context for work on st: its device's for a stream made
// here (ours), and 0 (any) for stream 0 and for streams made elsewhere
// (PyTorch's), which then run in the calling thread's context, else device
// 0's. A stream this Driver destroyed is refused (vmm.ErrInvalid): the
// driver must never see a dead handle.
func (d *Driver) streamCtx(st vmm.Stream) (c cuContext, dev vmm.Device, ours bool, err error) {
	if st == 0 {
		return 0, 0, false, nil
	}
	if dev, err := d.books.StreamDevice(st); err == nil {
		return d.devs[dev].Load().ctx, dev, true, nil
	}
	d.dead.Lock()
	_, dead := d.dead.streams[st]
	d.dead.Unlock()
	if dead {
		return 0, 0, false, fmt.Errorf("stream %#x was destroyed: %w", uintptr(st), vmm.ErrInvalid)
	}
	return 0, 0, false, nil
}

// buried records that st was destroyed, or (alive) that its address is a
// live stream again.
func (d *Driver) buried(st vmm.Stream, alive bool) {
	d.dead.Lock()
	defer d.dead.Unlock()
	if alive {
		delete(d.dead.streams, st)
		return
	}
	if d.dead.streams == nil {
		d.dead.streams = make(map[vmm.Stream]struct{})
	}
	d.dead.streams[st] = struct{}{}
}

// StreamSynchronize waits for the work queued on st. Stream 0 is the legacy
// default stream of the calling thread's context (device 0's if it has
// none); a stream this Driver did not make (a CUstream of PyTorch, say) is
// passed to the driver as is.
func (d *Driver) StreamSynchronize(st vmm.Stream) error {
	if err := d.live(); err != nil {
		return err
	}
	c, _, _, err := d.streamCtx(st)
	if err != nil {
		return err
	}
	if err := d.sym.streamSynchronize(c, st); err != nil {
		return fmt.Errorf("cuStreamSynchronize %#x: %w", uintptr(st), err)
	}
	return nil
}

// DeviceSynchronize waits for the work queued on every stream of dev's
// primary context (cuCtxSynchronize).
func (d *Driver) DeviceSynchronize(dev vmm.Device) error {
	if err := d.live(); err != nil {
		return err
	}
	s, err := d.device(dev)
	if err != nil {
		return err
	}
	if err := d.sym.ctxSynchronize(s.ctx); err != nil {
		return fmt.Errorf("cuCtxSynchronize on device %d: %w", dev, err)
	}
	return nil
}

// EventCreate makes an event without timing in dev's primary context.
func (d *Driver) EventCreate(dev vmm.Device) (vmm.Event, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	e, err := d.sym.eventCreate(s.ctx)
	if err != nil {
		return 0, fmt.Errorf("cuEventCreate on device %d: %w", dev, err)
	}
	d.books.AddEvent(e, dev)
	return e, nil
}

// eventCtx returns the context of a live event.
func (d *Driver) eventCtx(e vmm.Event) (cuContext, vmm.Device, error) {
	dev, err := d.books.EventDevice(e)
	if err != nil {
		return 0, 0, err
	}
	return d.devs[dev].Load().ctx, dev, nil
}

// EventRecord records e on st, in e's context. A stream made here must be
// on e's device; stream 0 and foreign streams are passed on as is.
func (d *Driver) EventRecord(e vmm.Event, st vmm.Stream) error {
	if err := d.live(); err != nil {
		return err
	}
	c, dev, err := d.eventCtx(e)
	if err != nil {
		return err
	}
	_, sdev, ours, err := d.streamCtx(st)
	if err != nil {
		return err
	}
	if ours && sdev != dev {
		return fmt.Errorf("recording event %#x of device %d on stream %#x of device %d: %w", uintptr(e), dev, uintptr(st), sdev, vmm.ErrInvalid)
	}
	if err := d.sym.eventRecord(c, e, st); err != nil {
		return fmt.Errorf("cuEventRecord %#x on stream %#x: %w", uintptr(e), uintptr(st), err)
	}
	return nil
}

// EventQuery reports whether e has completed (CUDA_ERROR_NOT_READY is
// false, nil).
func (d *Driver) EventQuery(e vmm.Event) (bool, error) {
	if err := d.live(); err != nil {
		return false, err
	}
	c, _, err := d.eventCtx(e)
	if err != nil {
		return false, err
	}
	done, err := d.sym.eventQuery(c, e)
	if err != nil {
		return false, fmt.Errorf("cuEventQuery %#x: %w", uintptr(e), err)
	}
	return done, nil
}

// EventSynchronize waits for e to complete.
func (d *Driver) EventSynchronize(e vmm.Event) error {
	if err := d.live(); err != nil {
		return err
	}
	c, _, err := d.eventCtx(e)
	if err != nil {
		return err
	}
	if err := d.sym.eventSynchronize(c, e); err != nil {
		return fmt.Errorf("cuEventSynchronize %#x: %w", uintptr(e), err)
	}
	return nil
}

// EventDestroy destroys an event made by EventCreate.
func (d *Driver) EventDestroy(e vmm.Event) error {
	if err := d.live(); err != nil {
		return err
	}
	dev, err := d.books.RemoveEvent(e)
	if err != nil {
		return err
	}
	if err := d.sym.eventDestroy(d.devs[dev].Load().ctx, e); err != nil {
		d.books.AddEvent(e, dev)
		return fmt.Errorf("cuEventDestroy %#x: %w", uintptr(e), err)
	}
	return nil
}

// MemAlloc makes a plain allocation with cuMemAlloc in dev's primary
// context.
func (d *Driver) MemAlloc(dev vmm.Device, size uint64) (vmm.DevicePtr, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, fmt.Errorf("allocating 0 bytes on device %d: %w", dev, vmm.ErrInvalid)
	}
	if size > s.total {
		return 0, fmt.Errorf("allocating %d bytes on device %d: it has %d bytes: %w", size, dev, s.total, vmm.ErrOutOfMemory)
	}
	p, err := d.sym.memAlloc(s.ctx, size)
	if err != nil {
		return 0, fmt.Errorf("cuMemAlloc of %d bytes on device %d: %w", size, dev, err)
	}
	d.books.AddAlloc(p, size)
	return p, nil
}

// MemFree frees an allocation made by MemAlloc. If cuMemFree fails the
// allocation stays live.
func (d *Driver) MemFree(p vmm.DevicePtr) error {
	if err := d.live(); err != nil {
		return err
	}
	size, err := d.books.BeginFreeAlloc(p)
	if err != nil {
		return err
	}
	if err := d.sym.memFree(0, p); err != nil {
		d.books.AddAlloc(p, size)
		return fmt.Errorf("cuMemFree %v: %w", p, err)
	}
	return nil
}
