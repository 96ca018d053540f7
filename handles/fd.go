package handles

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/xseg-dev/xseg/vmm"
)

// FD is an owned POSIX file descriptor: an exported physical page, a memfd,
// or any descriptor that must be closed exactly once. The zero value is not
// usable; make one with [NewFD].
//
// Ownership is explicit: [FD.Close] gives the descriptor back, [FD.Dup]
// makes a second owned descriptor of the same open file, and [FD.Disown]
// moves ownership out to the caller. A cleanup closes a descriptor whose FD
// became unreachable while still owning it; it is a safety net, not a
// lifetime rule: the garbage collector feels no pressure from descriptors.
//
// An FD is safe for concurrent use; Close and Disown race benignly (exactly
// one of them wins the descriptor).
type FD struct {
	mu struct {
		sync.Mutex
		raw     int // -1 once closed or disowned
		cleanup runtime.Cleanup
	}
}

// NewFD takes ownership of raw, which must be an open descriptor (>= 0).
// The caller must not close raw itself afterwards.
func NewFD(raw int) (*FD, error) {
	if raw < 0 {
		return nil, fmt.Errorf("owning fd %d: %w", raw, vmm.ErrInvalid)
	}
	fd := &FD{}
	fd.mu.raw = raw
	fd.mu.cleanup = runtime.AddCleanup(fd, closeLeaked, raw)
	return fd, nil
}

// closeLeaked is the cleanup of an FD dropped without Close.
func closeLeaked(raw int) { _ = closeRaw(raw) }

// Int returns the descriptor number, or -1 once the FD was closed or
// disowned. The number stays owned by fd: do not close it.
func (fd *FD) Int() int {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	return fd.mu.raw
}

// Close closes the descriptor. It is idempotent: closing a closed or
// disowned FD returns nil.
func (fd *FD) Close() error {
	raw := fd.take()
	if raw < 0 {
		return nil
	}
	if err := closeRaw(raw); err != nil {
		return fmt.Errorf("closing fd %d: %w", raw, err)
	}
	return nil
}

// Disown moves ownership of the descriptor to the caller, who must close it,
// and returns it; fd is then closed. It returns -1 if fd was already closed
// or disowned.
func (fd *FD) Disown() int { return fd.take() }

// take empties fd and returns what it held, stopping the cleanup.
func (fd *FD) take() int {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	raw := fd.mu.raw
	if raw >= 0 {
		fd.mu.cleanup.Stop()
		fd.mu.raw = -1
	}
	return raw
}

// Dup returns a new owned descriptor of the same open file, close-on-exec.
// Duplicating a closed FD is ErrClosed.
func (fd *FD) Dup() (*FD, error) {
	fd.mu.Lock()
	defer fd.mu.Unlock()
	if fd.mu.raw < 0 {
		return nil, fmt.Errorf("duplicating fd: %w", vmm.ErrClosed)
	}
	raw, err := dupRaw(fd.mu.raw)
	if err != nil {
		return nil, fmt.Errorf("duplicating fd %d: %w", fd.mu.raw, err)
	}
	return NewFD(raw)
}

// CloseAll closes every FD of fds (nil entries are skipped) and returns the
// errors joined.
func CloseAll(fds []*FD) error {
	var errs []error
	for _, fd := range fds {
		if fd == nil {
			continue
		}
		if err := fd.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
