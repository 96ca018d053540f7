package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

func TestResultText(t *testing.T) {
	// The built-in table and the driver (once loaded) agree on these.
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY: out of memory", ErrorOutOfMemory.Error())
	require.Equal(t, "CUDA_ERROR_INVALID_VALUE: invalid argument", ErrorInvalidValue.Error())
	require.Equal(t, "CUDA_ERROR_NOT_READY", ErrorNotReady.Name())
	require.True(t, strings.HasPrefix(ErrorNoDevice.Error(), "CUDA_ERROR_NO_DEVICE: "), ErrorNoDevice.Error())
	// A code nobody knows still says which it is.
	require.Equal(t, "CUresult(12345): unrecognised CUDA error", Result(12345).Error())
}

func TestResultBuiltinTable(t *testing.T) {
	for r, text := range builtinText {
		require.True(t, strings.HasPrefix(text[0], "CUDA_ERROR_"), "name of %d: %q", int(r), text[0])
		require.NotEmpty(t, text[1], "text of %s", text[0])
	}
}

func TestResultIs(t *testing.T) {
	sentinels := []error{vmm.ErrOutOfMemory, vmm.ErrInvalid, vmm.ErrNotSupported, vmm.ErrClosed, vmm.ErrInUse}
	cases := []struct {
		r    Result
		want error // nil: matches none
	}{
		{ErrorOutOfMemory, vmm.ErrOutOfMemory},
		{ErrorInvalidValue, vmm.ErrInvalid},
		{ErrorInvalidHandle, vmm.ErrInvalid},
		{ErrorInvalidDevice, vmm.ErrInvalid},
		{ErrorNotSupported, vmm.ErrNotSupported},
		{ErrorNotPermitted, vmm.ErrNotSupported},
		{ErrorNoDevice, vmm.ErrNotSupported},
		{ErrorStubLibrary, vmm.ErrNotSupported},
		{ErrorDriverMismatch, vmm.ErrNotSupported},
		{ErrorCompatNotOnDevice, vmm.ErrNotSupported},
		{ErrorDeinitialized, vmm.ErrClosed},
		{ErrorNotReady, nil},
		{ErrorIllegalAddress, nil},
		{ErrorUnknown, nil},
		{ErrorInvalidContext, nil},
	}
	for _, c := range cases {
		// Wrapped as the methods wrap it.
		err := fmt.Errorf("cuMemMap 0x200000+2097152: %w", c.r)
		for _, s := range sentinels {
			require.Equal(t, s == c.want, errors.Is(err, s), "errors.Is(%v, %v)", c.r, s)
		}
		var r Result
		require.True(t, errors.As(err, &r), "errors.As(%v)", err)
		require.Equal(t, c.r, r)
	}
}
