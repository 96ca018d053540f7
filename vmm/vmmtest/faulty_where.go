package vmmtest

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// faultable is every method Faulty forwards. Its methods that return an
// error are the operations: allOps is derived from it, so that a new driver
// method is an operation as soon as Faulty forwards it.
type faultable interface {
	vmm.Driver
	vmm.AllocIPC
	vmm.AllocFD
	vmm.AsyncMemsetter
}

var (
	_ faultable = (*Faulty)(nil)

	// allOps lists the operations, sorted by name.
	allOps = opsOf(reflect.TypeFor[faultable]())
)

// opsOf lists the methods of interface type t that return an error last,
// sorted by name.
func opsOf(t reflect.Type) []Op {
	if t.Kind() != reflect.Interface {
		panic(fmt.Sprintf("vmmtest: OpsOf[%v]: not an interface", t))
	}
	errType := reflect.TypeFor[error]()
	var ops []Op
	for i := range t.NumMethod() {
		m := t.Method(i)
		if n := m.Type.NumOut(); n > 0 && m.Type.Out(n-1) == errType {
			ops = append(ops, Op(m.Name))
		}
	}
	slices.Sort(ops)
	return ops
}

// Where is the half of an [Injector] that says which operations it may fail:
// a set of operations. The nil Where holds them all. Build one with Ops, the
// categories (PageOps, RangeOps, ...) or OpsOf, and combine them with Or, And
// and Not.
type Where func(op Op) bool

// Has reports whether op is in w.
func (w Where) Has(op Op) bool { return w == nil || w(op) }

// List returns the operations in w, sorted by name.
func (w Where) List() []Op {
	var ops []Op
	for _, op := range allOps {
		if w.Has(op) {
			ops = append(ops, op)
		}
	}
	return ops
}

// Or is the operations in w or in v.
func (w Where) Or(v Where) Where { return func(op Op) bool { return w.Has(op) || v.Has(op) } }

// And is the operations in both w and v.
func (w Where) And(v Where) Where { return func(op Op) bool { return w.Has(op) && v.Has(op) } }

// Not is every operation not in w.
func (w Where) Not() Where { return func(op Op) bool { return !w.Has(op) } }

// Ops is the set of the operations given. It panics on a name that is no
// operation of the driver, so a typo cannot arm an injector that never fires.
func Ops(ops ...Op) Where {
	set := make(map[Op]bool, len(ops))
	for _, op := range ops {
		if _, ok := slices.BinarySearch(allOps, op); !ok {
			panic(fmt.Sprintf("vmmtest: Ops: %q is not an operation of the driver", op))
		}
		set[op] = true
	}
	return func(op Op) bool { return set[op] }
}

// AllOps is every operation: the methods of vmm.Driver, and of the optional
// driver interfaces Faulty forwards, that return an error.
func AllOps() Where { return Ops(allOps...) }

// OpsOf is the operations that are methods of interface I, e.g.
// OpsOf[vmm.Driver](). It panics if I is not an interface.
func OpsOf[I any]() Where { return Ops(opsOf(reflect.TypeFor[I]())...) }

// The categories of operations are vmm's role interfaces, derived from
// them: a new driver method is in its role's category with no edit here.
// They are disjoint; Close is in none (Lifecycle's Usage returns no error).

// DeviceOps is the queries of the driver and its devices (vmm.Devices).
func DeviceOps() Where { return OpsOf[vmm.Devices]() }

// RangeOps is reserving and giving back address ranges (vmm.Ranges).
func RangeOps() Where { return OpsOf[vmm.Ranges]() }

// PageOps is the physical pages: making, mapping, access, destroying
// (vmm.Pages).
func PageOps() Where { return OpsOf[vmm.Pages]() }

// SharingOps is the exports and imports of pages and plain allocations
// (vmm.PageSharing, vmm.AllocIPC, vmm.AllocFD).
func SharingOps() Where {
	return OpsOf[vmm.PageSharing]().Or(OpsOf[vmm.AllocIPC]()).Or(OpsOf[vmm.AllocFD]())
}

// StreamOps is the streams, events and synchronizations (vmm.Streams).
func StreamOps() Where { return OpsOf[vmm.Streams]() }

// DataOps is the copies and memsets (vmm.Copies, vmm.AsyncMemsetter).
func DataOps() Where { return OpsOf[vmm.Copies]().Or(OpsOf[vmm.AsyncMemsetter]()) }

// PlainOps is the plain allocations (vmm.PlainAllocs).
func PlainOps() Where { return OpsOf[vmm.PlainAllocs]() }
