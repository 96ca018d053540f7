//go:build linux

package ipc

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestMappingFaultMatrix fails every driver operation of Open (import,
// reserve, map, set access) and of Mapping.Close, alone and with the
// operation that undoes it; after each case a new Open works, Close
// reaches nil and the importing driver holds nothing, with no fd left open.
func TestMappingFaultMatrix(t *testing.T) {
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	ptr, err := a.Alloc(5<<20, 0) // three 2 MiB pages
	require.NoError(t, err)
	e := newExporter(t, ExporterOptions{})
	s, err := e.ShareBlock(exp, a, ptr)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	mappingFaultMatrix(t, desc)
}

// TestMappingFaultMatrixSpans is the matrix over a block of allocations of
// 1, 3 and 2 pages: every Map, Unmap, import and release of an allocation
// of any size failed in turn, alone and in the undo.
func TestMappingFaultMatrixSpans(t *testing.T) {
	exp := backendDriver(t, "host")
	b := newSpanBlock(t, exp, []int{1, 3, 2}, 4096, 9<<20)
	e := newExporter(t, ExporterOptions{})
	s, err := e.ShareBlock(exp, b, b.ptr())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	require.Equal(t, []int{1, 3, 2}, s.Descriptor().Spans)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	mappingFaultMatrix(t, desc)
}

// TestMappingFaultMatrixChunked is the matrix over a block of an
// allocator with chunks (a chunk and a page of its own), opened through
// pidfd, whose lease is answered while the pages are mapped, and through
// the socket.
func TestMappingFaultMatrixChunked(t *testing.T) {
	exp := backendDriver(t, "host")
	a := chunkedAlloc(t, exp)
	ptr, err := a.Alloc(9<<20, 0) // four whole pages in a chunk, then a page
	require.NoError(t, err)
	e := newExporter(t, ExporterOptions{})
	s, err := e.ShareBlock(exp, a, ptr)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	require.Equal(t, []int{4, 1}, s.Descriptor().Spans)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	if ProbePidfdGetfd() == nil {
		t.Run("pidfd", func(t *testing.T) { mappingFaultMatrix(t, desc, TransportPidfd) })
	}
	t.Run("socket", func(t *testing.T) { mappingFaultMatrix(t, desc) })
}

// mappingFaultMatrix runs the fault matrix of Open and Close of desc on
// fresh host drivers, fetching through via (default: the socket).
func mappingFaultMatrix(t *testing.T, desc []byte, via ...Transport) {
	if via == nil {
		via = []Transport{TransportSocket}
	}
	opts := OpenOptions{Fetch: FetchOptions{Transports: via}}
	open := func(d vmm.Driver) (*Mapping, error) { return Open(context.Background(), desc, d, 0, opts) }
	closeMapping := func(m **Mapping) func() error {
		return func() error {
			if *m == nil {
				return nil
			}
			return (*m).Close()
		}
	}
	openClose := func(d vmm.Driver) func() error {
		return func() error {
			m, err := open(d)
			if err != nil {
				return err
			}
			return m.Close()
		}
	}
	scenarios := []vmmtest.Scenario{
		{Name: "ipc-open", Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
			var m *Mapping
			return vmmtest.Subject{
				Act:   func() (err error) { m, err = open(d); return err },
				Again: openClose(d),
				Close: closeMapping(&m),
			}, nil
		}},
		{Name: "ipc-close", Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
			m, err := open(d)
			if err != nil {
				return vmmtest.Subject{}, err
			}
			return vmmtest.Subject{Act: m.Close, Close: m.Close}, nil
		}},
	}
	n := vmmtest.RunMatrix(t, func() (vmm.Driver, error) { return host.Open(host.Options{}) }, scenarios)
	require.Greater(t, n, 20)
	if !t.Failed() {
		t.Logf("fault matrix: %d cases, 0 leaks", n)
	}
}
