//go:build !linux

package handles

import (
	"fmt"
	"runtime"

	"github.com/xseg-dev/xseg/vmm"
)

// POSIX-fd handles and their authentication memfd are made of Linux calls;
// elsewhere each answers errNoFDs.

var errNoFDs = fmt.Errorf("fd handles need Linux, not %s: %w", runtime.GOOS, vmm.ErrNotSupported)

func closeRaw(int) error                           { return errNoFDs }
func dupRaw(int) (int, error)                      { return -1, errNoFDs }
func newSealedFile([]byte) (*FD, error)            { return nil, errNoFDs }
func (d *Descriptor) readAuth(int) ([]byte, error) { return nil, errNoFDs }
func claimFile(int, []byte) (Claimant, error)      { return Claimant{}, errNoFDs }

// NewClaim makes an unclaimed claim memfd.
func NewClaim() (*FD, error) { return nil, errNoFDs }

// FileIDOf returns the identity of the file fd names.
func FileIDOf(fd int) (FileID, error) { return FileID{}, errNoFDs }

// SameOpenFile reports whether fds a and b name the same open file.
func SameOpenFile(a, b *FD) (bool, error) { return false, errNoFDs }
