//go:build !cgo || !linux

package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

func TestOpenWithoutCgo(t *testing.T) {
	d, err := Open()
	require.Nil(t, d)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.Contains(t, err.Error(), "built without cgo")
	var drv vmm.Driver = &Driver{}
	_, err = drv.Reserve(2<<20, 0)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
}
