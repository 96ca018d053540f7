package ledger

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Plain allocations live in l.allocs (made by MemAlloc) and l.opened
// (allocations of other processes opened through CUDA's legacy IPC,
// OpenAllocIPC), by base address. Copies may touch both kinds (AllocAt);
// only the first can be freed or exported, only the second closed.

// AddAlloc records a plain allocation made by MemAlloc.
func (l *Ledger) AddAlloc(ptr vmm.DevicePtr, size uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.allocs[ptr] = size
	l.usage.Allocs++
	l.usage.AllocBytes += size
}

// BeginFreeAlloc removes a plain allocation made by MemAlloc; ErrInvalid if
// ptr is not one (an allocation opened through IPC included).
func (l *Ledger) BeginFreeAlloc(ptr vmm.DevicePtr) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	size, ok := l.allocs[ptr]
	if !ok {
		if _, opened := l.opened[ptr]; opened {
			return 0, fmt.Errorf("freeing %v: an allocation of another process opened through IPC (close it with CloseAllocIPC): %w", ptr, vmm.ErrInvalid)
		}
		return 0, fmt.Errorf("freeing %v: not a live allocation: %w", ptr, vmm.ErrInvalid)
	}
	delete(l.allocs, ptr)
	l.usage.Allocs--
	l.usage.AllocBytes -= size
	return size, nil
}

// Alloc returns the size of the plain allocation made by MemAlloc that
// starts at ptr; ErrInvalid if there is none (what says what the caller
// was doing).
func (l *Ledger) Alloc(what string, ptr vmm.DevicePtr) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	size, ok := l.allocs[ptr]
	if !ok {
		if _, opened := l.opened[ptr]; opened {
			return 0, fmt.Errorf("%s %v: an allocation of another process opened through IPC: %w", what, ptr, vmm.ErrInvalid)
		}
		return 0, fmt.Errorf("%s %v: not the start of a live allocation: %w", what, ptr, vmm.ErrInvalid)
	}
	return size, nil
}

// AddIPCOpen records an allocation of another process opened through IPC
// at ptr. ErrInUse if the books already hold an allocation there (a driver
// that answers a second open of one handle with the same address): the
// caller then undoes its open.
func (l *Ledger) AddIPCOpen(ptr vmm.DevicePtr, size uint64) error {
	if size == 0 || ptr.Add(size) < ptr {
		return fmt.Errorf("opening an IPC allocation of %d bytes at %v: empty or wraps around: %w", size, ptr, vmm.ErrInvalid)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, made := l.allocs[ptr]
	if _, opened := l.opened[ptr]; opened || made {
		return fmt.Errorf("opening an IPC allocation at %v: an allocation there is already open in this process: %w", ptr, vmm.ErrInUse)
	}
	l.opened[ptr] = size
	l.usage.IPCOpens++
	l.usage.IPCOpenBytes += size
	return nil
}

// BeginCloseIPC removes an allocation opened through IPC and returns its
// size; ErrInvalid if ptr is not the base of one. UndoCloseIPC puts it
// back.
func (l *Ledger) BeginCloseIPC(ptr vmm.DevicePtr) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	size, ok := l.opened[ptr]
	if !ok {
		return 0, fmt.Errorf("closing %v: not an allocation opened through IPC: %w", ptr, vmm.ErrInvalid)
	}
	delete(l.opened, ptr)
	l.usage.IPCOpens--
	l.usage.IPCOpenBytes -= size
	return size, nil
}

// UndoCloseIPC puts back what BeginCloseIPC removed.
func (l *Ledger) UndoCloseIPC(ptr vmm.DevicePtr, size uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.opened[ptr] = size
	l.usage.IPCOpens++
	l.usage.IPCOpenBytes += size
}

// AllocAt returns the plain allocation that contains ptr, of either kind.
func (l *Ledger) AllocAt(ptr vmm.DevicePtr) (base vmm.DevicePtr, size uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range [2]map[vmm.DevicePtr]uint64{l.allocs, l.opened} {
		for b, s := range m {
			if ptr >= b && ptr < b.Add(s) {
				return b, s, true
			}
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
