package vmmtest

import (
	"errors"
	"sync"

	"github.com/xseg-dev/xseg/vmm"
)

// Chained is a Faulty that can also fail an operation together with the
// one that undoes it: FailNthThen fails the n-th next call of op and then
// the first call of then after that failure (Map fails, then the Unmap or
// Release of its undo). Fault-matrix tests use it to reach undo paths.
type Chained struct {
	*Faulty
	mu struct {
		sync.Mutex
		first, then Op
	}
}

// NewChained wraps d; no call fails until FailNth or FailNthThen says so.
func NewChained(d vmm.Driver) *Chained { return &Chained{Faulty: NewFaulty(d)} }

// FailNthThen fails the n-th next call of op (with the default error) and,
// once it has failed, the next call of then.
func (c *Chained) FailNthThen(op Op, n int, then Op) {
	c.mu.Lock()
	c.mu.first, c.mu.then = op, then
	c.mu.Unlock()
	c.FailNth(op, n, nil)
}

// Reset disarms every failure, chained ones included, and forgets counts.
func (c *Chained) Reset() {
	c.mu.Lock()
	c.mu.first, c.mu.then = "", ""
	c.mu.Unlock()
	c.Faulty.Reset()
}

// after arms the chained failure once err is the injected failure of the
// first operation.
func (c *Chained) after(err error) error {
	var inj *InjectedError
	if !errors.As(err, &inj) {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.then != "" && inj.Op == c.mu.first {
		c.Faulty.FailNth(c.mu.then, 1, nil)
		c.mu.first, c.mu.then = "", ""
	}
	return err
}

// The operations a test may chain from: each passes the call to Faulty and
// arms the chained failure if the call failed on purpose.

// Reserve implements vmm.Driver.
func (c *Chained) Reserve(size, align uint64) (vmm.DevicePtr, error) {
	p, err := c.Faulty.Reserve(size, align)
	return p, c.after(err)
}

// Unreserve implements vmm.Driver.
func (c *Chained) Unreserve(ptr vmm.DevicePtr, size uint64) error {
	return c.after(c.Faulty.Unreserve(ptr, size))
}

// Create implements vmm.Driver.
func (c *Chained) Create(dev vmm.Device, size uint64, types vmm.HandleType) (vmm.Handle, error) {
	h, err := c.Faulty.Create(dev, size, types)
	return h, c.after(err)
}

// Release implements vmm.Driver.
func (c *Chained) Release(h vmm.Handle) error { return c.after(c.Faulty.Release(h)) }

// Map implements vmm.Driver.
func (c *Chained) Map(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) error {
	return c.after(c.Faulty.Map(ptr, size, h, offset))
}

// Unmap implements vmm.Driver.
func (c *Chained) Unmap(ptr vmm.DevicePtr, size uint64) error {
	return c.after(c.Faulty.Unmap(ptr, size))
}

// SetAccess implements vmm.Driver.
func (c *Chained) SetAccess(ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) error {
	return c.after(c.Faulty.SetAccess(ptr, size, access))
}

// ImportFD implements vmm.Driver.
func (c *Chained) ImportFD(fd int) (vmm.Handle, error) {
	h, err := c.Faulty.ImportFD(fd)
	return h, c.after(err)
}

// MemAlloc implements vmm.Driver.
func (c *Chained) MemAlloc(dev vmm.Device, size uint64) (vmm.DevicePtr, error) {
	p, err := c.Faulty.MemAlloc(dev, size)
	return p, c.after(err)
}

// MemFree implements vmm.Driver.
func (c *Chained) MemFree(ptr vmm.DevicePtr) error { return c.after(c.Faulty.MemFree(ptr)) }

// StreamSynchronize implements vmm.Driver.
func (c *Chained) StreamSynchronize(s vmm.Stream) error {
	return c.after(c.Faulty.StreamSynchronize(s))
}

// EventSynchronize implements vmm.Driver.
func (c *Chained) EventSynchronize(e vmm.Event) error {
	return c.after(c.Faulty.EventSynchronize(e))
}

// Baseline is what a process has open before a fault-matrix case: the
// file descriptors. Leaks compares against it.
type Baseline struct {
	fds fdTable
	err error
}

// TakeBaseline lists the open file descriptors.
func TakeBaseline() Baseline {
	warmRuntimeFDs()
	fds, err := openFDs()
	return Baseline{fds: fds, err: err}
}

// Leaks describes what d still holds (its Usage, if not zero) and the fds
// opened since b was taken; nil when nothing leaked. Like CheckLeaks, it
// assumes no other test opens fds meanwhile.
func (b Baseline) Leaks(d vmm.Driver) []string {
	var out []string
	if u := d.Usage(); !u.Zero() {
		out = append(out, "driver holds "+u.String())
	}
	if b.err != nil {
		return out
	}
	after, err := openFDs()
	if err != nil {
		return append(out, "listing fds: "+err.Error())
	}
	return append(out, newFDs(b.fds, after)...)
}

// MatrixOps are the operations a fault matrix fails, and UndoOps those it
// fails after them: what an undo or a teardown calls.
var (
	MatrixOps = []Op{OpReserve, OpUnreserve, OpCreate, OpRelease, OpMap, OpUnmap, OpSetAccess,
		OpImportFD, OpMemAlloc, OpMemFree, OpStreamSynchronize, OpEventSynchronize}
	UndoOps = []Op{OpUnmap, OpRelease, OpUnreserve, OpMemFree}
)
