package vmmtest

import (
	"errors"
	"fmt"
	"sync"

	"github.com/xseg-dev/xseg/vmm"
)

// Op names a method of vmm.Driver whose calls Faulty counts and can fail.
type Op string

// The operations, one for each method of vmm.Driver that returns an error.
const (
	OpDriverVersion     Op = "DriverVersion"
	OpDeviceCount       Op = "DeviceCount"
	OpDeviceInfo        Op = "DeviceInfo"
	OpMemInfo           Op = "MemInfo"
	OpReserve           Op = "Reserve"
	OpUnreserve         Op = "Unreserve"
	OpCreate            Op = "Create"
	OpRelease           Op = "Release"
	OpMap               Op = "Map"
	OpUnmap             Op = "Unmap"
	OpSetAccess         Op = "SetAccess"
	OpGetAccess         Op = "GetAccess"
	OpExportFD          Op = "ExportFD"
	OpImportFD          Op = "ImportFD"
	OpExportFabric      Op = "ExportFabric"
	OpImportFabric      Op = "ImportFabric"
	OpStreamCreate      Op = "StreamCreate"
	OpStreamDestroy     Op = "StreamDestroy"
	OpStreamSynchronize Op = "StreamSynchronize"
	OpDeviceSynchronize Op = "DeviceSynchronize"
	OpEventCreate       Op = "EventCreate"
	OpEventRecord       Op = "EventRecord"
	OpEventQuery        Op = "EventQuery"
	OpEventSynchronize  Op = "EventSynchronize"
	OpEventDestroy      Op = "EventDestroy"
	OpCopyHtoD          Op = "CopyHtoD"
	OpCopyDtoH          Op = "CopyDtoH"
	OpCopyDtoD          Op = "CopyDtoD"
	OpMemset            Op = "Memset"
	OpMemsetAsync       Op = "MemsetAsync"
	OpMemAlloc          Op = "MemAlloc"
	OpMemFree           Op = "MemFree"
	OpExportAllocIPC    Op = "ExportAllocIPC"
	OpOpenAllocIPC      Op = "OpenAllocIPC"
	OpCloseAllocIPC     Op = "CloseAllocIPC"
	OpExportAllocFD     Op = "ExportAllocFD"
	OpClose             Op = "Close"
)

// ErrInjected is the cause of an injected failure of an operation that has
// no more specific default (Create and MemAlloc fail with
// vmm.ErrOutOfMemory).
var ErrInjected = errors.New("injected fault")

// InjectedError is the error of a call that Faulty failed on purpose. It
// matches its cause (the error given to FailNth, or the default) through
// errors.Is.
type InjectedError struct {
	Op   Op
	Call int // the call's number, counting from 1 since New or Reset
	Err  error
}

// Error says that the failure was injected, in which call, and its cause.
func (e *InjectedError) Error() string {
	return fmt.Sprintf("vmmtest: injected failure of %s (call %d): %v", e.Op, e.Call, e.Err)
}

// Unwrap returns the cause.
func (e *InjectedError) Unwrap() error { return e.Err }

// Faulty is a vmm.Driver that passes every call to the driver it wraps,
// counts the calls of each operation, and fails the calls chosen with
// FailNth without passing them on. A failed call changes nothing, so the
// wrapped driver's Usage stays exact. Faulty is safe for concurrent use; the
// n-th call of an operation is the n-th to reach Faulty, in whatever order
// concurrent callers arrive.
type Faulty struct {
	d  vmm.Driver
	mu struct {
		sync.Mutex
		calls map[Op]int
		// fail holds, per operation, the call numbers that fail and how.
		fail map[Op]map[int]error
	}
}

var _ vmm.Driver = (*Faulty)(nil)

// NewFaulty wraps d; no call fails until FailNth says so.
func NewFaulty(d vmm.Driver) *Faulty {
	f := &Faulty{d: d}
	f.Reset()
	return f
}

// Unwrap returns the wrapped driver.
func (f *Faulty) Unwrap() vmm.Driver { return f.d }

// FailNth makes the n-th next call of op (1: the very next) fail with err
// instead of reaching the wrapped driver. A nil err stands for a default:
// an error matching vmm.ErrOutOfMemory for OpCreate and OpMemAlloc, ErrInjected
// for the others. The error returned is an *InjectedError wrapping it. Several
// calls of one op may be armed at once; arming the same call again replaces
// its error. FailNth panics if n < 1.
func (f *Faulty) FailNth(op Op, n int, err error) {
	if n < 1 {
		panic(fmt.Sprintf("vmmtest: FailNth(%s, %d): n must be at least 1", op, n))
	}
	if err == nil {
		err = ErrInjected
		if op == OpCreate || op == OpMemAlloc {
			err = fmt.Errorf("%w: %w", ErrInjected, vmm.ErrOutOfMemory)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	at := f.mu.calls[op] + n
	if f.mu.fail[op] == nil {
		f.mu.fail[op] = map[int]error{}
	}
	f.mu.fail[op][at] = err
}

// Calls reports how many calls of op Faulty has seen since NewFaulty or
// Reset, the failed ones included.
func (f *Faulty) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.calls[op]
}

// Reset forgets the counts and disarms every failure.
func (f *Faulty) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.calls = map[Op]int{}
	f.mu.fail = map[Op]map[int]error{}
}

// enter counts a call of op and returns the injected error if this call is
// armed to fail.
func (f *Faulty) enter(op Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.calls[op]++
	n := f.mu.calls[op]
	err, ok := f.mu.fail[op][n]
	if !ok {
		return nil
	}
	delete(f.mu.fail[op], n)
	return &InjectedError{Op: op, Call: n, Err: err}
}
