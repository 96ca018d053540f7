package vmmtest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/xseg-dev/xseg/vmm"
)

// ErrCapture is the cause of the calls CaptureGuard fails.
var ErrCapture = errors.New("a call illegal during stream capture")

// CaptureGuard wraps a driver for tests of CUDA graph captures on a backend
// that has none. While Armed is above zero (the test holds a private pool
// active) it fails every call that stream capture forbids, and records it:
// event query, record and synchronize, stream and device synchronize,
// unmap, and MemFree (cudaFree synchronizes the device). While Hold is set,
// events report incomplete to EventQuery (EventSynchronize still completes
// them).
type CaptureGuard struct {
	vmm.Driver
	Armed atomic.Int32
	Hold  atomic.Bool
	mu    sync.Mutex
	bad   []string
}

// Violations returns the forbidden calls made while armed, in order.
func (g *CaptureGuard) Violations() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.bad)
}

func (g *CaptureGuard) forbid(op string) error {
	if g.Armed.Load() == 0 {
		return nil
	}
	g.mu.Lock()
	g.bad = append(g.bad, op)
	g.mu.Unlock()
	return fmt.Errorf("%s while a pool is active: %w", op, ErrCapture)
}

// EventQuery implements vmm.Driver.
func (g *CaptureGuard) EventQuery(e vmm.Event) (bool, error) {
	if err := g.forbid("EventQuery"); err != nil {
		return false, err
	}
	done, err := g.Driver.EventQuery(e)
	return done && !g.Hold.Load(), err
}

// EventRecord implements vmm.Driver.
func (g *CaptureGuard) EventRecord(e vmm.Event, s vmm.Stream) error {
	return g.call("EventRecord", func() error { return g.Driver.EventRecord(e, s) })
}

// EventSynchronize implements vmm.Driver.
func (g *CaptureGuard) EventSynchronize(e vmm.Event) error {
	return g.call("EventSynchronize", func() error { return g.Driver.EventSynchronize(e) })
}

// StreamSynchronize implements vmm.Driver.
func (g *CaptureGuard) StreamSynchronize(s vmm.Stream) error {
	return g.call("StreamSynchronize", func() error { return g.Driver.StreamSynchronize(s) })
}

// DeviceSynchronize implements vmm.Driver.
func (g *CaptureGuard) DeviceSynchronize(dev vmm.Device) error {
	return g.call("DeviceSynchronize", func() error { return g.Driver.DeviceSynchronize(dev) })
}

// Unmap implements vmm.Driver.
func (g *CaptureGuard) Unmap(ptr vmm.DevicePtr, size uint64) error {
	return g.call("Unmap", func() error { return g.Driver.Unmap(ptr, size) })
}

// MemFree implements vmm.Driver.
func (g *CaptureGuard) MemFree(ptr vmm.DevicePtr) error {
	return g.call("MemFree", func() error { return g.Driver.MemFree(ptr) })
}

func (g *CaptureGuard) call(op string, f func() error) error {
	if err := g.forbid(op); err != nil {
		return err
	}
	return f()
}
