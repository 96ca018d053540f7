package host_test

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

const gran = host.DefaultGranularity

// open opens a driver that the test closes when it ends, after checking that
// nothing is outstanding.
func open(t *testing.T, o host.Options) *host.Driver {
	t.Helper()
	d, err := host.Open(o)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.True(t, d.Usage().Zero(), "outstanding at the end of the test: %v", d.Usage())
		require.NoError(t, d.Close())
	})
	return d
}

// fdCount counts the open file descriptors of the process.
func fdCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// vmasIn counts the kernel mappings (lines of /proc/self/maps) that overlap
// [ptr, ptr+size).
func vmasIn(t *testing.T, ptr vmm.DevicePtr, size uint64) int {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		span, _, _ := strings.Cut(sc.Text(), " ")
		lo, hi, ok := strings.Cut(span, "-")
		require.True(t, ok, "maps line %q", sc.Text())
		start, err := strconv.ParseUint(lo, 16, 64)
		require.NoError(t, err)
		end, err := strconv.ParseUint(hi, 16, 64)
		require.NoError(t, err)
		if start < uint64(ptr)+size && end > uint64(ptr) {
			n++
		}
	}
	require.NoError(t, sc.Err())
	return n
}

// rwPages reserves n pages, creates one page of n*gran bytes of the given
// types, maps it and grants device 0 read-write access. The test undoes all
// of it when it ends.
func rwPages(t *testing.T, d *host.Driver, n int, types vmm.HandleType) (vmm.DevicePtr, vmm.Handle) {
	t.Helper()
	size := uint64(n) * gran
	ptr, err := d.Reserve(size, 0)
	require.NoError(t, err)
	h, err := d.Create(0, size, types)
	require.NoError(t, err)
	require.NoError(t, d.Map(ptr, size, h, 0))
	require.NoError(t, d.SetAccess(ptr, size, vmm.ReadWrite(0)))
	t.Cleanup(func() {
		require.NoError(t, d.Unmap(ptr, size))
		require.NoError(t, d.Release(h))
		require.NoError(t, d.Unreserve(ptr, size))
	})
	return ptr, h
}

// fill returns n bytes of a pattern that depends on seed.
func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7+i>>9) ^ seed
	}
	return b
}
