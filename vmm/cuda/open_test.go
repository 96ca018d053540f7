//go:build cgo && linux

package cuda

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// TestLoadMissingLibrary checks, on any machine, that a library dlopen
// cannot find gives ErrNotSupported with dlopen's reason.
func TestLoadMissingLibrary(t *testing.T) {
	const name = "libxseg-no-such-driver.so.1"
	l, err := load(name)
	require.Nil(t, l)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.Contains(t, err.Error(), name)
	require.Contains(t, err.Error(), "cannot open shared object file")
}

// TestOpenWithoutDriver checks Open on a machine without libcuda (this
// package's CI): ErrNotSupported, naming the library and dlopen's reason.
func TestOpenWithoutDriver(t *testing.T) {
	d, err := Open()
	if err == nil {
		require.NoError(t, d.Close())
		t.Skip("a CUDA driver is installed here")
	}
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	if os.Getenv("XSEG_REQUIRE_GPU") == "1" {
		t.Fatalf("XSEG_REQUIRE_GPU=1, but Open failed: %v", err)
	}
	if _, lerr := load(libraryName); lerr != nil {
		// No library: Open says what dlopen said.
		require.Equal(t, lerr.Error(), err.Error())
		require.Contains(t, err.Error(), libraryName)
	}
	// The failure is remembered, and stays the same.
	_, err2 := Open()
	require.Equal(t, err.Error(), err2.Error())
}

func closeFD(fd int) error { return os.NewFile(uintptr(fd), "exported page").Close() }
