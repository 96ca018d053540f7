//go:build linux

package ipc

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

const (
	page2M  = 2 << 20
	share64 = 64 << 20
	nobody  = 65534
)

// share64MiB shares a 64 MiB block at offset 4096 of 2 MiB memfd pages
// (33 of them) holding the parent's pattern; it returns the share and the
// parent's mapping of the block.
func share64MiB(t *testing.T, e *Exporter) (*Share, *mapping) {
	t.Helper()
	const offset = 4096
	n := int((offset + share64 + page2M - 1) / page2M)
	fds := makePages(t, n, page2M)
	m, err := mapPages(fds, page2M, offset, share64)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.unmap()) })
	fillPattern(m.block, seedParent)
	s, err := e.ShareFDs(fds, Extent{PageSize: page2M, Offset: offset, Length: share64}, nil)
	require.NoError(t, err)
	require.Equal(t, 33, s.Descriptor().PageCount)
	return s, m
}

func newExporter(t *testing.T, opts ExporterOptions) *Exporter {
	t.Helper()
	e, err := NewExporter(opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	return e
}

func requirePidfd(t *testing.T) {
	t.Helper()
	if err := ProbePidfdGetfd(); errors.Is(err, vmm.ErrNotSupported) {
		t.Skipf("pidfd_getfd unavailable: %v", err)
	} else {
		require.NoError(t, err)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("starting a child under another uid needs root")
	}
}

func TestPidfdShare64MiB(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{NoSocket: true})
	s, m := share64MiB(t, e)
	require.Empty(t, s.Descriptor().Endpoint)
	rep := newChild(t, "import", nil, descEnv(t, s), envTransports+"=pidfd").run(t)
	require.Equal(t, "pidfd", rep["via"])
	requireChildFDs(t, rep)
	require.NoError(t, checkPattern(m.block, seedChild), "parent must read the child's bytes")
}

func TestSocketShare64MiB(t *testing.T) {
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{batch: 5}) // 33 fds in 7 messages
	s, m := share64MiB(t, e)
	rep := newChild(t, "import", nil, descEnv(t, s), envTransports+"=socket").run(t)
	require.Equal(t, "socket", rep["via"])
	requireChildFDs(t, rep)
	require.NoError(t, checkPattern(m.block, seedChild))
}

// TestOtherUIDPidfdDeniedSocketWorks is the container case: the importer
// may not ptrace the exporter, the policy admits its uid.
func TestOtherUIDPidfdDeniedSocketWorks(t *testing.T) {
	requireRoot(t)
	requirePidfd(t)
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{Policy: Policy{UIDs: []uint32{nobody}}})
	s, m := share64MiB(t, e)
	uid := uint32(nobody)
	rep := newChild(t, "import", &uid, descEnv(t, s), envEPERM+"=1").run(t)
	require.Equal(t, "EPERM", rep["pidfd"])
	require.Equal(t, "socket", rep["via"], "auto must fall back to the socket")
	require.Equal(t, "65534", rep["uid"])
	requireChildFDs(t, rep)
	require.NoError(t, checkPattern(m.block, seedChild))
}

func TestRefusedPeerAndServerKeepsServing(t *testing.T) {
	requireRoot(t)
	requireNoFDLeak(t)
	var mu sync.Mutex
	var reported []error
	e := newExporter(t, ExporterOptions{OnError: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, err)
	}})
	s, m := share64MiB(t, e)
	uid := uint32(nobody)
	rep := newChild(t, "import-refused", &uid, descEnv(t, s)).run(t)
	require.Equal(t, "true", rep["refused"], rep["err"])
	require.Equal(t, "true", rep["eperm"], rep["err"])
	require.Contains(t, rep["err"], "pidfd: pidfd_getfd")
	require.Contains(t, rep["err"], "socket: exporter pid")
	require.Contains(t, rep["err"], refusalMessage)
	require.NotContains(t, rep["err"], "uid", "the refusal names no uid")

	// The exporter reports after its reply is on the wire: the child may
	// have exited first.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(reported) == 1
	}, 5*time.Second, 5*time.Millisecond)
	mu.Lock()
	require.ErrorIs(t, reported[0], ErrRefused)
	mu.Unlock()

	// The exporter still serves a peer its policy admits.
	rep = newChild(t, "import", nil, descEnv(t, s), envTransports+"=socket").run(t)
	require.Equal(t, "socket", rep["via"])
	require.NoError(t, checkPattern(m.block, seedChild))
}

// TestExporterExitsBeforeImporter: the importer's fds and mapping outlive
// the exporter process.
func TestExporterExitsBeforeImporter(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	c, stdin, raw := startExporterChild(t, "export")
	d, err := handles.ParseDescriptor(raw)
	require.NoError(t, err)
	require.Equal(t, c.cmd.Process.Pid, d.ExporterPID)

	var got []*Received
	for _, tr := range []Transport{TransportPidfd, TransportSocket} {
		r, err := Fetch(context.Background(), d, FetchOptions{Transports: []Transport{tr}})
		require.NoError(t, err)
		got = append(got, r)
	}
	m, err := mapPages(got[0].FDs, d.PageSize, d.Offset, d.Length)
	require.NoError(t, err)

	require.NoError(t, stdin.Close())
	require.NoError(t, c.cmd.Wait(), c.errOut.String())
	_, err = Fetch(context.Background(), d, FetchOptions{})
	require.Error(t, err, "the exporter is gone")

	require.NoError(t, checkPattern(m.block, seedParent), "mapping valid after the exporter exited")
	fillPattern(m.block, seedChild)
	m2, err := mapPages(got[1].FDs, d.PageSize, d.Offset, d.Length)
	require.NoError(t, err)
	require.NoError(t, checkPattern(m2.block, seedChild), "both fetches name the same pages")
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(got[1].FDs[3].Int(), &st))
	require.EqualValues(t, d.PageSize, st.Size)
	require.NoError(t, m.unmap())
	require.NoError(t, m2.unmap())
	for _, r := range got {
		require.NoError(t, r.Close())
	}
}
