package vmmtest

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// CheckLeaks registers a cleanup on t that fails the test if, when the test
// and the cleanups registered after this call have run, d still has anything
// outstanding (d.Usage() is not zero) or a file descriptor opened since this
// call is still open. It does not close d.
//
// Call it right after opening d and before making anything with it, so that
// its cleanup runs after the test's own cleanups (they run last-in,
// first-out). The fd check compares the process's open descriptors
// (/proc/self/fd) with those open at the call, so it assumes no other test of
// the process opens descriptors at the same time: do not use it in parallel
// tests. Where /proc/self/fd cannot be read, only Usage is checked.
func CheckLeaks(t testing.TB, d vmm.Driver) {
	t.Helper()
	warmRuntimeFDs()
	before, fdErr := openFDs()
	if fdErr != nil {
		t.Logf("vmmtest: not checking fds: %v", fdErr)
	}
	t.Cleanup(func() {
		if u := d.Usage(); !u.Zero() {
			t.Errorf("vmmtest: driver %s leaked: %v", d.Backend(), u)
		}
		if fdErr != nil {
			return
		}
		after, err := openFDs()
		if err != nil {
			t.Errorf("vmmtest: listing fds after the test: %v", err)
			return
		}
		if leaked := newFDs(before, after); len(leaked) > 0 {
			t.Errorf("vmmtest: %d file descriptors opened by the test are still open (%d before, %d after):\n\t%s",
				len(leaked), len(before), len(after), strings.Join(leaked, "\n\t"))
		}
	})
}

// WaitGoroutines waits up to within for the process to be back to at most
// n goroutines (goroutines a test started finish a moment after it has
// its answer) and fails t, with every goroutine's stack, if it is not.
func WaitGoroutines(t testing.TB, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for runtime.NumGoroutine() > n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > n {
		buf := make([]byte, 1<<20)
		t.Fatalf("vmmtest: %d goroutines, at most %d expected (goroutines leaked):\n%s", g, n, buf[:runtime.Stack(buf, true)])
	}
}

// fdTable maps each open fd to what it names ("/memfd:x (deleted)").
type fdTable map[int]string

// openFDs lists the open descriptors of this process.
func openFDs() (fdTable, error) {
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	names, err := dir.Readdirnames(-1)
	self := int(dir.Fd())
	cerr := dir.Close()
	if err != nil {
		return nil, fmt.Errorf("reading /proc/self/fd: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("closing /proc/self/fd: %w", cerr)
	}
	fds := make(fdTable, len(names))
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd == self {
			continue
		}
		target, err := os.Readlink("/proc/self/fd/" + name)
		if err != nil {
			// Closed between the listing and now.
			continue
		}
		fds[fd] = target
	}
	return fds, nil
}

// newFDs describes the fds of after that were not open, naming the same
// thing, in before.
func newFDs(before, after fdTable) []string {
	var out []string
	for fd, target := range after {
		if old, ok := before[fd]; ok && old == target {
			continue
		}
		out = append(out, fmt.Sprintf("fd %d -> %s", fd, target))
	}
	slices.Sort(out)
	return out
}

var warmOnce sync.Once

// warmRuntimeFDs makes the Go runtime open the descriptors it keeps for the
// life of the process (the network poller's epoll and wake-up fds), so that
// the first test that starts a child process or opens a pipe is not blamed
// for them.
func warmRuntimeFDs() {
	warmOnce.Do(func() {
		// os.Pipe registers the read end with the poller, which starts it.
		r, w, err := os.Pipe()
		if err != nil {
			return
		}
		_ = r.Close()
		_ = w.Close()
	})
}
