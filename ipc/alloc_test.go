//go:build linux

package ipc

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/cuda"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// backendDriver opens the named backend for t, checks at its end that
// nothing leaked (driver usage and fds) and closes it. cuda skips without
// a driver unless XSEG_REQUIRE_GPU=1.
func backendDriver(t *testing.T, name string) vmm.Driver {
	t.Helper()
	var d vmm.Driver
	var err error
	if name == "cuda" {
		d, err = cuda.Open()
		switch {
		case err == nil:
		case os.Getenv("XSEG_REQUIRE_GPU") == "1":
			t.Fatalf("XSEG_REQUIRE_GPU=1, but the CUDA driver does not open: %v", err)
		case errors.Is(err, vmm.ErrNotSupported):
			t.Skipf("no CUDA driver or device: %v", err)
		}
	} else {
		d, err = host.Open(host.Options{})
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	if name == "cuda" {
		if err := warmCUDA(d); err != nil {
			t.Logf("warming the CUDA driver up: %v", err)
		}
	}
	vmmtest.CheckLeaks(t, d)
	return d
}

// warmCUDA does once what the test will do, so that the descriptors the
// CUDA driver opens at first use and keeps are not counted as leaks.
func warmCUDA(d vmm.Driver) error {
	cfg := expandable.ClassicConfig()
	cfg.Shareable = true
	a, err := expandable.New(d, 0, cfg, nil)
	if err != nil {
		return err
	}
	defer func() { _ = a.Close() }()
	p, err := a.Alloc(4<<20, 0)
	if err != nil {
		return err
	}
	buf := make([]byte, 4096)
	if err := errors.Join(d.CopyHtoD(p, buf), d.CopyDtoH(buf, p)); err != nil {
		return err
	}
	pin, err := a.PinBlock(p)
	if err != nil {
		return err
	}
	defer func() { _ = pin.Unpin() }()
	fd, err := d.ExportFD(pin.Pages[0])
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	h, err := d.ImportFD(fd)
	if err != nil {
		return err
	}
	return errors.Join(d.Release(h), warmAllocIPC(d))
}

// warmAllocIPC exports a plain allocation's legacy IPC handle once, for
// the fallback tests: the driver may keep what it opens for that.
func warmAllocIPC(d vmm.Driver) error {
	p, err := d.MemAlloc(0, 2<<20)
	if err != nil {
		return err
	}
	a, err := vmm.AllocIPCOf(d)
	if err == nil {
		_, err = a.ExportAllocIPC(p)
	}
	return errors.Join(err, d.MemFree(p))
}

// shareableAlloc makes an expandable allocator with exportable pages.
func shareableAlloc(t *testing.T, d vmm.Driver) *expandable.Allocator {
	t.Helper()
	cfg := expandable.ClassicConfig()
	cfg.Shareable = true
	a, err := expandable.New(d, 0, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

// proc is an interactive child: lines to its stdin, key=value lines from
// its stdout.
type proc struct {
	c     *child
	stdin io.WriteCloser
	out   *bufio.Scanner
	rep   map[string]string
}

func startChild(t *testing.T, role string, uid *uint32, env ...string) *proc {
	t.Helper()
	c := newChild(t, role, uid, env...)
	stdin, err := c.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	t.Cleanup(func() { _ = c.cmd.Wait() })
	return &proc{c: c, stdin: stdin, out: bufio.NewScanner(stdout), rep: map[string]string{}}
}

// until reads the child's lines until one equals line.
func (p *proc) until(t *testing.T, line string) {
	t.Helper()
	for p.out.Scan() {
		if p.out.Text() == line {
			return
		}
		if k, v, ok := strings.Cut(p.out.Text(), "="); ok {
			p.rep[k] = v
		}
	}
	t.Fatalf("child ended before %q: %v; stderr: %s", line, p.out.Err(), p.c.errOut.String())
}

func (p *proc) send(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(p.stdin, line+"\n")
	require.NoError(t, err, "child stderr: %s", p.c.errOut.String())
}

// wait reads the rest of the child's report and waits for it to exit.
func (p *proc) wait(t *testing.T) map[string]string {
	t.Helper()
	for p.out.Scan() {
		if k, v, ok := strings.Cut(p.out.Text(), "="); ok {
			p.rep[k] = v
		}
	}
	require.NoError(t, p.stdin.Close())
	require.NoError(t, p.c.cmd.Wait(), "child failed: %s", p.c.errOut.String())
	return p.rep
}

// shareCase is one run of runShare.
type shareCase struct {
	backend string
	size    uint64
	opts    ExporterOptions
	uid     *uint32
	env     []string
	via     string // the transport the child must report
	// once shares with ShareBlockOnce: a pidfd importer of an exporter
	// with a socket must report the share claimed.
	once bool
}

// runShare allocates a block from a shareable allocator, fills it, shares
// it with a child that opens it, checks the child's bytes, then frees the
// block while the child still maps it and checks that it is not reused
// until the child closes. It returns the time from ShareBlock to the
// child's first read.
func runShare(t *testing.T, c shareCase) time.Duration {
	d := backendDriver(t, c.backend)
	a := shareableAlloc(t, d)
	pre, err := a.Alloc(3<<20, 0) // so that the shared block starts inside a page
	require.NoError(t, err)
	ptr, err := a.Alloc(c.size, 0)
	require.NoError(t, err)
	require.NoError(t, writePattern(d, ptr, c.size, seedParent))
	e := newExporter(t, c.opts)
	p := startChild(t, "open", c.uid, append(c.env, envBackend+"="+c.backend)...)
	p.until(t, "ready")

	t0 := time.Now()
	share := e.ShareBlock
	if c.once {
		share = e.ShareBlockOnce
	}
	s, err := share(d, a, ptr)
	require.NoError(t, err)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	p.send(t, "desc "+hex.EncodeToString(desc))
	p.until(t, "written")
	t1, err := strconv.ParseInt(p.rep["t1"], 10, 64)
	require.NoError(t, err)
	require.Equal(t, c.via, p.rep["via"])
	require.NoError(t, readPattern(d, ptr, c.size, seedChild), "the parent reads the child's bytes")

	leased := p.rep["leased"] == "true"
	require.Equal(t, !c.opts.NoSocket, leased, "an importer holds a lease whenever the exporter serves a socket")
	require.Equal(t, fmt.Sprint(c.once && c.via == "pidfd" && !c.opts.NoSocket), p.rep["claimed"])
	requireFreedNotReused(t, a, d, s, ptr, c.size, leased)

	p.send(t, "close")
	p.until(t, "closed")
	rep := p.wait(t)
	requireChildFDs(t, rep)
	require.Equal(t, vmm.Usage{}.String(), rep["usage"], "the child's driver holds nothing after Close")
	require.Eventually(t, func() bool { return a.Pinned() == 0 }, 5*time.Second, time.Millisecond,
		"the importer's Close ends its lease and unpins")
	require.NoError(t, a.Free(pre))
	return time.Unix(0, t1).Sub(t0)
}

// pinningAllocator is what requireFreedNotReused needs of the expandable
// and fallback allocators.
type pinningAllocator interface {
	Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error)
	Free(ptr vmm.DevicePtr) error
	EmptyCache() error
	Stats() spec.Stats
	Pinned() int
}

// requireFreedNotReused: the exporter closes the share and frees the block
// while the importer maps it. With a lease the pages stay pinned: a new
// block of the same size lies elsewhere, EmptyCache keeps them, and they
// still hold the importer's bytes.
func requireFreedNotReused(t *testing.T, a pinningAllocator, d vmm.Driver, s *Share, ptr vmm.DevicePtr, size uint64, leased bool) {
	require.Equal(t, 1, a.Pinned())
	require.NoError(t, s.Close())
	if !leased {
		require.Zero(t, a.Pinned(), "without a socket the share's Close is the last word")
		require.NoError(t, a.Free(ptr))
		return
	}
	require.Equal(t, 1, a.Pinned(), "a lease keeps a closed share pinned")
	require.NoError(t, a.Free(ptr))
	require.ErrorIs(t, a.Free(ptr), vmm.ErrInvalid, "a freed pinned block is freed")
	require.NoError(t, a.EmptyCache())
	require.GreaterOrEqual(t, a.Stats().ReservedBytes.All.Current, int64(size), "EmptyCache keeps the pinned memory")
	q, err := a.Alloc(size, 0)
	require.NoError(t, err)
	require.True(t, q.Add(size) <= ptr || ptr.Add(size) <= q, "new block %v overlaps the pinned %v", q, ptr)
	require.NoError(t, readPattern(d, ptr, size, seedChild), "pinned memory stays mapped and untouched")
	require.NoError(t, a.Free(q))
}

func TestAllocSharePidfd(t *testing.T) {
	requirePidfd(t)
	runShare(t, shareCase{backend: "host", size: share64, via: "pidfd",
		env: []string{envTransports + "=pidfd"}})
}

// TestAllocShareOnce: a share for one importer, fetched by pidfd (the
// importer claims it and waits for no answer), by pidfd from an exporter
// without a socket (nothing to claim with), and by socket (the exporter
// claims it for the importer).
func TestAllocShareOnce(t *testing.T) {
	requirePidfd(t)
	for _, c := range []shareCase{
		{via: "pidfd", env: []string{envTransports + "=pidfd"}},
		{via: "pidfd", opts: ExporterOptions{NoSocket: true}},
		{via: "socket", env: []string{envTransports + "=socket"}},
	} {
		c.backend, c.size, c.once = "host", share64, true
		t.Run(fmt.Sprintf("%s-nosocket=%t", c.via, c.opts.NoSocket), func(t *testing.T) { runShare(t, c) })
	}
}

func TestAllocSharePidfdNoSocket(t *testing.T) {
	requirePidfd(t)
	runShare(t, shareCase{backend: "host", size: share64, via: "pidfd", opts: ExporterOptions{NoSocket: true}})
}

func TestAllocShareSocket(t *testing.T) {
	runShare(t, shareCase{backend: "host", size: share64, via: "socket",
		env: []string{envTransports + "=socket"}})
}

// TestAllocShareOtherUID is the container case: pidfd_getfd is denied to
// the importer, the policy admits its uid, auto falls back to the socket.
func TestAllocShareOtherUID(t *testing.T) {
	requireRoot(t)
	requirePidfd(t)
	uid := uint32(nobody)
	runShare(t, shareCase{backend: "host", size: share64, via: "socket", uid: &uid,
		opts: ExporterOptions{Policy: Policy{UIDs: []uint32{nobody}}}, env: []string{envEPERM + "=1"}})
}

func TestAllocShareRefusedPeer(t *testing.T) {
	requireRoot(t)
	d := backendDriver(t, "host")
	a := shareableAlloc(t, d)
	ptr, err := a.Alloc(5<<20, 0)
	require.NoError(t, err)
	e := newExporter(t, ExporterOptions{OnError: func(error) {}})
	uid := uint32(nobody)
	p := startChild(t, "open", &uid, envExpectFail+"=1")
	p.until(t, "ready")
	s, err := e.ShareBlock(d, a, ptr)
	require.NoError(t, err)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)
	p.send(t, "desc "+hex.EncodeToString(desc))
	rep := p.wait(t)
	require.Equal(t, "true", rep["refused"], rep["err"])
	require.Contains(t, rep["err"], "pidfd: pidfd_getfd")
	require.Contains(t, rep["err"], refusalMessage)
	require.NotContains(t, rep["err"], "uid", "the refusal names no uid")
	require.NoError(t, s.Close())
	require.Zero(t, a.Pinned())
	require.NoError(t, a.Free(ptr))
}

// TestCUDAShareAcrossProcesses is runShare on the GPU. XSEG_IPC_SIZE sets
// the block's size (default 64 MiB); it logs share-to-first-read.
func TestCUDAShareAcrossProcesses(t *testing.T) {
	size := uint64(share64)
	if v := os.Getenv(envSize); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		size = n
	}
	for _, tr := range []string{"pidfd", "socket", "pidfd-once"} {
		t.Run(tr, func(t *testing.T) {
			via, once := strings.CutSuffix(tr, "-once")
			if via == "pidfd" {
				requirePidfd(t)
			}
			dt := runShare(t, shareCase{backend: "cuda", size: size, via: via, env: []string{envTransports + "=" + via}, once: once})
			t.Logf("cuda %s: %d MiB shared, share to first read in the importer: %v", tr, size>>20, dt)
		})
	}
}

// TestAllocExporterExitsFirst: the mapping outlives the exporting process.
func TestAllocExporterExitsFirst(t *testing.T) {
	requirePidfd(t)
	d := backendDriver(t, "host")
	const size = 9<<20 + 4096
	c, stdin, desc := startExporterChild(t, "export-alloc", envSize+"="+strconv.Itoa(size), envBackend+"=host")
	im := NewImporter(d)
	m, err := im.Open(context.Background(), desc, 0, OpenOptions{})
	require.NoError(t, err)
	require.Equal(t, TransportPidfd, m.Via())
	require.True(t, m.Leased())
	require.EqualValues(t, size, m.Len())

	require.NoError(t, stdin.Close())
	require.NoError(t, c.cmd.Wait(), c.errOut.String())
	require.NoError(t, readPattern(d, m.Ptr(), size, seedParent), "mapping valid after the exporter exited")
	require.NoError(t, writePattern(d, m.Ptr(), size, seedChild))
	require.NoError(t, readPattern(d, m.Ptr(), size, seedChild))
	m2, err := im.Open(context.Background(), desc, 0, OpenOptions{})
	require.NoError(t, err, "a second Open through the importer shares the mapping")
	require.Equal(t, m.Ptr(), m2.Ptr())
	require.NoError(t, m.Close())
	require.NoError(t, readPattern(d, m2.Ptr(), size, seedChild), "the mapping lives while one Open holds it")
	require.NoError(t, m2.Close())
	dd, err := handles.ParseDescriptor(desc)
	require.NoError(t, err)
	_, err = Fetch(context.Background(), dd, FetchOptions{})
	require.Error(t, err, "a fresh fetch finds the exporter gone")
}

// TestOpenTwiceSharesOneMapping: two Opens of one descriptor through one
// Importer share one mapping of exactly the shared extent and one lease.
func TestOpenTwiceSharesOneMapping(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	exp := backendDriver(t, "host")
	imp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	_, err := a.Alloc(1<<20+512, 0) // small pool, 2 MiB pages: the block starts inside a page
	require.NoError(t, err)
	ptr, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, writePattern(exp, ptr, 1<<20, seedParent))
	e := newExporter(t, ExporterOptions{})
	s, err := e.ShareBlock(exp, a, ptr)
	require.NoError(t, err)
	d := s.Descriptor()
	require.EqualValues(t, 2<<20, d.PageSize)
	desc, err := s.MarshalBinary()
	require.NoError(t, err)

	im := NewImporter(imp)
	m1, err := im.Open(context.Background(), desc, 0, OpenOptions{})
	require.NoError(t, err)
	m2, err := im.Open(context.Background(), desc, 0, OpenOptions{})
	require.NoError(t, err)
	require.Equal(t, m1.Ptr(), m2.Ptr())
	require.Equal(t, d.Offset, uint64(m1.Ptr())%d.PageSize, "the block sits at its offset in the first page")
	u := imp.Usage()
	require.Equal(t, 1, u.Ranges)
	require.Equal(t, d.Bytes(), u.RangeBytes, "the importer reserves only the shared extent")
	require.Equal(t, d.PageCount, u.Mappings)
	require.Eventually(t, func() bool { return s.Leases() == 1 }, 5*time.Second, time.Millisecond, "one lease per mapping")
	require.NoError(t, readPattern(imp, m1.Ptr(), m1.Len(), seedParent))

	require.NoError(t, m1.Close())
	require.NoError(t, m1.Close(), "Close is idempotent and drops one reference")
	require.NoError(t, readPattern(imp, m2.Ptr(), m2.Len(), seedParent))
	require.NoError(t, m2.Close())
	require.True(t, imp.Usage().Zero(), "the last Close gives everything back: %v", imp.Usage())
	require.Eventually(t, func() bool { return s.Leases() == 0 }, 5*time.Second, time.Millisecond)
	require.NoError(t, s.Close())
	require.Zero(t, a.Pinned())

	_, err = im.Open(context.Background(), desc[:10], 0, OpenOptions{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
}
