package vmmtest

import "github.com/xseg-dev/xseg/vmm"

// Chained is Faulty, under the name the fault-matrix tests knew it by when
// only it could chain a failure to another (FailNthThen, now on Faulty).
type Chained = Faulty

// NewChained is NewFaulty.
func NewChained(d vmm.Driver) *Chained { return NewFaulty(d) }

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
