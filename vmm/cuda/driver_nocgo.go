//go:build !cgo || !linux

package cuda

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// This build has no cgo (or is not Linux): Open always fails, and no
// Driver exists. The Driver's logic builds all the same, so that code
// using the type builds everywhere, and its methods on a Driver not made
// by Open fail with errNoCgo.

var errNoCgo = fmt.Errorf("vmm/cuda: built without cgo: %w", vmm.ErrNotSupported)

// errUnopened is the error of a Driver that Open did not make.
var errUnopened = errNoCgo

// Open fails with an error matching vmm.ErrNotSupported: this build cannot
// load the CUDA driver.
func Open() (*Driver, error) { return nil, errNoCgo }

// driverErrorText has no driver to ask in this build.
func driverErrorText(Result) (name, text string, ok bool) { return "", "", false }
