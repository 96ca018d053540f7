package ledger

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// AddAlloc records a plain allocation.
func (l *Ledger) AddAlloc(ptr vmm.DevicePtr, size uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.allocs[ptr] = size
	l.usage.Allocs++
	l.usage.AllocBytes += size
}

// BeginFreeAlloc removes a plain allocation; ErrInvalid if ptr is not one.
func (l *Ledger) BeginFreeAlloc(ptr vmm.DevicePtr) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	size, ok := l.allocs[ptr]
	if !ok {
		return 0, fmt.Errorf("freeing %v: not a live allocation: %w", ptr, vmm.ErrInvalid)
	}
	delete(l.allocs, ptr)
	l.usage.Allocs--
	l.usage.AllocBytes -= size
	return size, nil
}

// AllocAt returns the plain allocation that contains ptr.
func (l *Ledger) AllocAt(ptr vmm.DevicePtr) (base vmm.DevicePtr, size uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for b, s := range l.allocs {
		if ptr >= b && ptr < b.Add(s) {
			return b, s, true
		}
	}
	return 0, 0, false
}

// AddStream records a stream.
func (l *Ledger) AddStream(s vmm.Stream, dev vmm.Device) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.streams[s] = dev
	l.usage.Streams++
}

// StreamDevice returns the device of a live stream.
func (l *Ledger) StreamDevice(s vmm.Stream) (vmm.Device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.streams[s]
	if !ok {
		return 0, fmt.Errorf("stream %#x is not live: %w", uintptr(s), vmm.ErrInvalid)
	}
	return d, nil
}

// RemoveStream forgets a stream; ErrInvalid if it is not live.
func (l *Ledger) RemoveStream(s vmm.Stream) (vmm.Device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.streams[s]
	if !ok {
		return 0, fmt.Errorf("destroying stream %#x: not a live stream: %w", uintptr(s), vmm.ErrInvalid)
	}
	delete(l.streams, s)
	l.usage.Streams--
	return d, nil
}

// AddEvent records an event.
func (l *Ledger) AddEvent(e vmm.Event, dev vmm.Device) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events[e] = dev
	l.usage.Events++
}

// EventDevice returns the device of a live event.
func (l *Ledger) EventDevice(e vmm.Event) (vmm.Device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.events[e]
	if !ok {
		return 0, fmt.Errorf("event %#x is not live: %w", uintptr(e), vmm.ErrInvalid)
	}
	return d, nil
}

// RemoveEvent forgets an event; ErrInvalid if it is not live.
func (l *Ledger) RemoveEvent(e vmm.Event) (vmm.Device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.events[e]
	if !ok {
		return 0, fmt.Errorf("destroying event %#x: not a live event: %w", uintptr(e), vmm.ErrInvalid)
	}
	delete(l.events, e)
	l.usage.Events--
	return d, nil
}
