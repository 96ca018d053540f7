package vmmtest

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// ErrInjected is the cause of an injected failure of an operation that has
// no more specific default (Create and MemAlloc fail with
// vmm.ErrOutOfMemory).
var ErrInjected = errors.New("injected fault")

// InjectedError is the error of a call that Faulty failed on purpose. It
// matches its cause (the injector's Err, or the default) through errors.Is.
type InjectedError struct {
	Op   Op
	Call int // the call's number among those of Op, from 1 since NewFaulty or Reset
	Err  error
}

// Error says that the failure was injected, in which call, and its cause.
func (e *InjectedError) Error() string {
	return fmt.Sprintf("vmmtest: injected failure of %s (call %d): %v", e.Op, e.Call, e.Err)
}

// Unwrap returns the cause.
func (e *InjectedError) Unwrap() error { return e.Err }

// Faulty is a vmm.Driver that passes every call to the driver it wraps,
// counts the calls of each operation, and fails the calls its injectors
// choose without passing them on. A failed call changes nothing, so the
// wrapped driver's Usage stays exact.
//
// The model, after pebble's vfs/errorfs, keeps apart where a fault may
// strike and when it does. An [Injector] is a [Where] (a set of operations:
// Ops(OpMap, OpUnmap), RangeOps(), AllOps(), combined with Or, And, Not), a
// [When] (OnNth, EveryNth, Always, WithProbability with a seed, After a
// duration, AfterFailureOf another operation, combined with And, Or, Not,
// Then, Times, Once and PerOp) and the error to return. On each call every
// armed injector whose Where holds the operation sees it, in the order they
// were armed; if any fires, the call fails with the error of the last one
// that did. FailNth(op, n, err) is Injector{Ops(op), OnNth(n), err}.
//
// Faulty is safe for concurrent use; the n-th call of an operation is the
// n-th to reach Faulty, in whatever order concurrent callers arrive, and the
// injectors judge the calls one at a time in that order.
type Faulty struct {
	d  vmm.Driver
	mu struct {
		sync.Mutex
		now   func() time.Time
		calls map[Op]int
		armed []armed
	}
}

// Injector fails the calls of the operations in Where that When chooses,
// with Err.
type Injector struct {
	// Where is the operations it may fail; nil: every one.
	Where Where
	// When chooses among their calls; the zero When fails them all.
	When When
	// Err is the cause of the failures; nil: the operation's default, an
	// error matching vmm.ErrOutOfMemory for OpCreate and OpMemAlloc,
	// ErrInjected for the others. The error the call returns is an
	// *InjectedError wrapping it.
	Err error
}

// armed is an Injector in Faulty, its When started.
type armed struct {
	where Where
	when  trigger
	err   error
}

var _ vmm.Driver = (*Faulty)(nil)

// NewFaulty wraps d and arms the injectors given, if any.
func NewFaulty(d vmm.Driver, injectors ...Injector) *Faulty {
	f := &Faulty{d: d}
	f.mu.now = time.Now
	f.Reset()
	f.Inject(injectors...)
	return f
}

// Unwrap returns the wrapped driver.
func (f *Faulty) Unwrap() vmm.Driver { return f.d }

// SetClock makes now the clock of Call.Time and of After (nil: time.Now).
// now runs under Faulty's lock and must not call the driver.
func (f *Faulty) SetClock(now func() time.Time) {
	if now == nil {
		now = time.Now
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.now = now
}

// Inject arms the injectors after those armed already. Their Whens start
// now: counts at zero, After's durations from now.
func (f *Faulty) Inject(injectors ...Injector) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.mu.now()
	for _, inj := range injectors {
		f.mu.armed = append(f.mu.armed, armed{where: inj.Where, when: inj.When.begin(now), err: inj.Err})
	}
}

// FailNth makes the n-th next call of op (1: the very next) fail with err
// (nil: the default, as for Injector.Err) instead of reaching the wrapped
// driver. Several calls of one op may be armed at once; arming the same call
// again replaces its error. FailNth panics if n < 1.
func (f *Faulty) FailNth(op Op, n int, err error) {
	f.Inject(Injector{Where: Ops(op), When: OnNth(n), Err: err})
}

// FailNthThen fails the n-th next call of op (with the default error) and,
// once it has failed, the next call of then: Map fails, then the Unmap or
// Release of its undo. Fault-matrix tests use it to reach undo paths.
func (f *Faulty) FailNthThen(op Op, n int, then Op) {
	f.Inject(Injector{Where: Ops(op), When: OnNth(n)},
		Injector{Where: Ops(then), When: AfterFailureOf(Ops(op)).Once()})
}

// Calls reports how many calls of op Faulty has seen since NewFaulty or
// Reset, the failed ones included.
func (f *Faulty) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.calls[op]
}

// Reset forgets the counts and disarms every injector.
func (f *Faulty) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.calls = map[Op]int{}
	f.mu.armed = nil
}

// enter counts a call of op and returns the injected error if an injector
// fails it.
func (f *Faulty) enter(op Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.calls[op]++
	if len(f.mu.armed) == 0 {
		return nil
	}
	c := Call{Op: op, N: f.mu.calls[op], Time: f.mu.now()}
	var cause error
	fired := false
	for _, a := range f.mu.armed {
		if a.where.Has(op) && a.when.fires(c) {
			cause, fired = a.err, true
		}
	}
	if !fired {
		return nil
	}
	for _, a := range f.mu.armed {
		a.when.observe(op)
	}
	if cause == nil {
		cause = defaultCause(op)
	}
	return &InjectedError{Op: op, Call: c.N, Err: cause}
}

// defaultCause is the cause of an injected failure of op that was given
// none.
func defaultCause(op Op) error {
	if op == OpCreate || op == OpMemAlloc {
		return fmt.Errorf("%w: %w", ErrInjected, vmm.ErrOutOfMemory)
	}
	return ErrInjected
}
