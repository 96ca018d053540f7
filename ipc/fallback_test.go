//go:build linux

package ipc

import (
	"context"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// The fallback allocator's blocks live in plain allocations (segments of
// 20 MiB for these sizes), shared as a memfd on the host and a CUDA IPC
// handle on the GPU.
const (
	fbPre   = 3 << 20 // allocated first: the shared block starts 3 MiB into the segment
	fbShare = 6 << 20
	fbSeg   = 20 << 20
)

func fallbackAlloc(t *testing.T, d vmm.Driver) *fallback.Allocator {
	t.Helper()
	a, err := fallback.New(d, 0, fallback.DefaultConfig(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

// fbCase is one run of runFallbackShare.
type fbCase struct {
	backend string
	via     string   // the transport the child must report
	env     []string // for the child
}

// runFallbackShare allocates a 6 MiB block at offset 3 MiB of a fallback
// segment, fills it and the block before it, shares it with a child that
// maps it, writes its own pattern and reads it back, then checks that the
// freed shared block is not reused, nor its segment given back, until the
// child closes. It returns the time from ShareBlock to the child's first
// read.
func runFallbackShare(t *testing.T, c fbCase) time.Duration {
	d := backendDriver(t, c.backend)
	a := fallbackAlloc(t, d)
	pre, err := a.Alloc(fbPre, 0)
	require.NoError(t, err)
	ptr, err := a.Alloc(fbShare, 0)
	require.NoError(t, err)
	require.Equal(t, pre.Add(fbPre), ptr, "the block follows pre in its segment")
	require.NoError(t, writePattern(d, pre, fbPre, 7))
	require.NoError(t, writePattern(d, ptr, fbShare, seedParent))
	e := newExporter(t, ExporterOptions{})
	p := startChild(t, "open", nil, append(c.env, envBackend+"="+c.backend)...)
	p.until(t, "ready")

	t0 := time.Now()
	s, err := e.ShareBlock(d, a, ptr)
	require.NoError(t, err)
	desc := s.Descriptor()
	require.Equal(t, 1, desc.PageCount, "the segment is one page")
	require.EqualValues(t, fbPre, desc.Offset)
	require.EqualValues(t, fbShare, desc.Length)
	require.EqualValues(t, fbSeg, desc.PageSize)
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	p.send(t, "desc "+hex.EncodeToString(b))
	p.until(t, "written")
	t1, err := strconv.ParseInt(p.rep["t1"], 10, 64)
	require.NoError(t, err)
	require.Equal(t, c.via, p.rep["via"])
	require.Equal(t, "true", p.rep["leased"], "the exporter serves a socket: the importer holds a lease")
	require.NoError(t, readPattern(d, ptr, fbShare, seedChild), "the parent reads the child's bytes at the block's own address")
	require.NoError(t, readPattern(d, pre, fbPre, 7), "the rest of the segment kept its bytes")

	requireFreedNotReused(t, a, d, s, ptr, fbShare, true)
	p.send(t, "close")
	p.until(t, "closed")
	rep := p.wait(t)
	requireChildFDs(t, rep)
	require.Equal(t, vmm.Usage{}.String(), rep["usage"], "the child's driver holds nothing after Close")
	require.Eventually(t, func() bool { return a.Pinned() == 0 }, 5*time.Second, time.Millisecond,
		"the importer's Close ends its lease and unpins")
	require.NoError(t, a.Free(pre))
	require.NoError(t, a.EmptyCache())
	require.Zero(t, a.Stats().ReservedBytes.All.Current, "once unpinned the segment is given back")
	return time.Unix(0, t1).Sub(t0)
}

func TestFallbackSharePidfd(t *testing.T) {
	requirePidfd(t)
	runFallbackShare(t, fbCase{backend: "host", via: "pidfd", env: []string{envTransports + "=pidfd"}})
}

func TestFallbackShareSocket(t *testing.T) {
	runFallbackShare(t, fbCase{backend: "host", via: "socket", env: []string{envTransports + "=socket"}})
}

// TestCUDAFallbackShare is runFallbackShare on the GPU, through CUDA's
// legacy IPC; it also checks that the exporting process cannot open its
// own descriptor. It logs share-to-first-read.
func TestCUDAFallbackShare(t *testing.T) {
	dt := runFallbackShare(t, fbCase{backend: "cuda", via: "cuda-ipc", env: []string{envWarmOpen + "=1"}})
	t.Logf("cuda fallback: %d MiB block of a %d MiB segment shared by legacy IPC, share to first read in the importer: %v",
		fbShare>>20, fbSeg>>20, dt)
}

func TestCUDAFallbackOwnHandleRefused(t *testing.T) {
	d := backendDriver(t, "cuda")
	a := fallbackAlloc(t, d)
	ptr, err := a.Alloc(fbShare, 0)
	require.NoError(t, err)
	e := newExporter(t, ExporterOptions{})
	s, err := e.ShareBlock(d, a, ptr)
	require.NoError(t, err)
	require.Equal(t, handles.KindCUDAIPC, s.Descriptor().Kind)
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	_, err = Open(context.Background(), b, d, 0, OpenOptions{})
	require.ErrorIs(t, err, ErrOwnIPCHandle)
	require.ErrorContains(t, err, "process that exported it")
	require.Zero(t, d.Usage().IPCOpens)
	require.NoError(t, s.Close())
	require.Zero(t, a.Pinned())
	require.NoError(t, a.Free(ptr))
}
