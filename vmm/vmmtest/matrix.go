package vmmtest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// A Scenario is one path of a fault matrix: Setup makes an object over the
// driver it is given and brings it to the state before the path; the
// Subject it returns runs the path and closes the object.
type Scenario struct {
	Name  string
	Setup func(d vmm.Driver) (Subject, error)
}

// Subject is an object of a Scenario, ready for its path.
type Subject struct {
	// Act runs the path, with one fault or two armed. Its error is not
	// judged: what matters is what it leaves.
	Act func() error
	// Again, if set, runs after Act with every fault disarmed and must
	// succeed: the object works after the failure (growth is not blocked
	// by what a failed undo left behind).
	Again func() error
	// Close gives everything back; the matrix calls it, disarmed, until it
	// returns nil (at most MatrixCloses times).
	Close func() error
}

// MatrixCloses is how many Closes a case may need after its faults.
const MatrixCloses = 3

// RunMatrix runs every scenario once per case: each operation of MatrixOps
// that the path calls, failed at each of its calls, alone and followed by
// the failure of each of UndoOps. After each case, faults disarmed, Again
// must succeed and Close must reach nil, and then the driver must hold
// nothing (Usage zero) and no fd may be left open. open makes a fresh
// driver for a case; RunMatrix closes it. It returns the cases run.
func RunMatrix(t *testing.T, open func() (vmm.Driver, error), scenarios []Scenario) int {
	t.Helper()
	cases := 0
	for _, sc := range scenarios {
		for op, calls := range dryRun(t, open, sc) {
			for n := 1; n <= calls; n++ {
				for _, then := range append([]Op{""}, UndoOps...) {
					cases++
					name := fmt.Sprintf("%s/%s#%d", sc.Name, op, n)
					if then != "" {
						name += "+" + string(then)
					}
					if err := runCase(open, sc, op, n, then); err != nil {
						t.Errorf("fault matrix %s: %v", name, err)
					}
				}
			}
		}
	}
	return cases
}

// dryRun counts the calls of each MatrixOps operation the path makes.
func dryRun(t *testing.T, open func() (vmm.Driver, error), sc Scenario) map[Op]int {
	t.Helper()
	d, err := open()
	if err != nil {
		t.Fatalf("fault matrix %s: opening the driver: %v", sc.Name, err)
	}
	defer d.Close()
	c := NewFaulty(d)
	s, err := sc.Setup(c)
	if err != nil {
		t.Fatalf("fault matrix %s: setup: %v", sc.Name, err)
	}
	c.Reset()
	if err := s.Act(); err != nil {
		t.Fatalf("fault matrix %s: the path fails without faults: %v", sc.Name, err)
	}
	calls := map[Op]int{}
	for _, op := range MatrixOps {
		if n := c.Calls(op); n > 0 {
			calls[op] = n
		}
	}
	closeAll(s)
	return calls
}

// runCase runs one case on a fresh driver and returns what went wrong.
func runCase(open func() (vmm.Driver, error), sc Scenario, op Op, n int, then Op) (err error) {
	d, err := open()
	if err != nil {
		return err
	}
	defer func() {
		if cerr := d.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the driver: %w", cerr)
		}
	}()
	base := TakeBaseline()
	c := NewFaulty(d)
	s, err := sc.Setup(c)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	c.Reset()
	if then == "" {
		c.FailNth(op, n, nil)
	} else {
		c.FailNthThen(op, n, then)
	}
	_ = s.Act()
	c.Reset()
	if s.Again != nil {
		if err := s.Again(); err != nil {
			closeAll(s)
			return fmt.Errorf("after the fault, with none armed: %w", err)
		}
	}
	if err := closeAll(s); err != nil {
		return err
	}
	// A server goroutine of the same process (an exporter's end of a
	// socket) may close its fds a moment after Close returned.
	leaks := base.Leaks(d)
	for deadline := time.Now().Add(2 * time.Second); len(leaks) > 0 && time.Now().Before(deadline); leaks = base.Leaks(d) {
		time.Sleep(2 * time.Millisecond)
	}
	if len(leaks) > 0 {
		return fmt.Errorf("leaked after Close returned nil:\n\t%s", strings.Join(leaks, "\n\t"))
	}
	return nil
}

// closeAll calls Close until it returns nil, at most MatrixCloses times.
func closeAll(s Subject) error {
	var err error
	for range MatrixCloses {
		if err = s.Close(); err == nil {
			return nil
		}
	}
	return fmt.Errorf("Close still fails after %d calls: %w", MatrixCloses, err)
}
