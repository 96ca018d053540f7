//go:build linux

package ipc

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/cuda"
	"github.com/xseg-dev/xseg/vmm/host"
)

// Environment of the allocator children (see child_test.go for the rest).
const (
	envBackend    = "XSEG_IPC_BACKEND"     // host (default) or cuda
	envSize       = "XSEG_IPC_SIZE"        // bytes of the block the export child shares
	envExpectFail = "XSEG_IPC_EXPECT_FAIL" // the open child expects Open to fail
	envWarmOpen   = "XSEG_IPC_WARM_OPEN"   // the open child opens and closes once before counting fds
	chunk         = 64 << 20               // bytes per copy when checking a pattern
)

// allocRoles are the child roles of the allocator tests.
var allocRoles = map[string]func() error{
	"open":         childOpen,
	"export-alloc": childExportAlloc,
}

// openDriver opens the backend named by env XSEG_IPC_BACKEND.
func openDriver(name string) (vmm.Driver, error) {
	if name == "cuda" {
		return cuda.Open()
	}
	return host.Open(host.Options{})
}

// writePattern fills [ptr, ptr+n) with the pattern of seed, chunk by chunk.
func writePattern(d vmm.Driver, ptr vmm.DevicePtr, n uint64, seed byte) error {
	buf := make([]byte, min(n, chunk))
	for off := uint64(0); off < n; off += chunk {
		part := buf[:min(chunk, n-off)]
		fillPatternAt(part, seed, off)
		if err := d.CopyHtoD(ptr.Add(off), part); err != nil {
			return fmt.Errorf("writing pattern at %v: %w", ptr.Add(off), err)
		}
	}
	return nil
}

// readPattern checks that [ptr, ptr+n) holds the pattern of seed.
func readPattern(d vmm.Driver, ptr vmm.DevicePtr, n uint64, seed byte) error {
	buf := make([]byte, min(n, chunk))
	want := make([]byte, len(buf))
	for off := uint64(0); off < n; off += chunk {
		part, w := buf[:min(chunk, n-off)], want[:min(chunk, n-off)]
		if err := d.CopyDtoH(part, ptr.Add(off)); err != nil {
			return fmt.Errorf("reading at %v: %w", ptr.Add(off), err)
		}
		fillPatternAt(w, seed, off)
		if string(part) != string(w) {
			return fmt.Errorf("pattern %d differs in the chunk at byte %d", seed, off)
		}
	}
	return nil
}

// fillPatternAt fills b with the pattern of seed as it lies at byte off of
// the block.
func fillPatternAt(b []byte, seed byte, off uint64) {
	p := patternTile(seed)
	n := copy(b, p[off%tile:])
	for n < len(b) {
		n += copy(b[n:], p)
	}
}

// childOpen is the importer: it opens its driver, says "ready", reads
// "desc <hex>" from stdin, opens the block, reports the time of its first
// read, checks the parent's pattern, writes its own, says "written", and
// on "close" closes the mapping and reports its fds and driver usage.
func childOpen() error {
	d, err := openDriver(os.Getenv(envBackend))
	if err != nil {
		return err
	}
	if _, err := d.DeviceInfo(0); err != nil { // warm: start-up is not share time
		return err
	}
	if os.Getenv(envBackend) == "cuda" {
		// The CUDA driver opens descriptors at first use and keeps them:
		// count after it has done once what the child will do.
		if err := warmCUDA(d); err != nil {
			return fmt.Errorf("warming the CUDA driver up: %w", err)
		}
	}
	before, _ := countFDs()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<24)
	if !in.Scan() || !strings.HasPrefix(in.Text(), "desc ") {
		return fmt.Errorf("want a descriptor on stdin, got %q", in.Text())
	}
	desc, err := hex.DecodeString(strings.TrimPrefix(in.Text(), "desc "))
	if err != nil {
		return err
	}
	if err := checkEPERM(desc); err != nil {
		return err
	}
	if os.Getenv(envWarmOpen) != "" {
		// The first open reports the time to the first read; the fds are
		// counted around the second, once the driver has opened what it
		// keeps for the rest of the process.
		if err := openFirstRead(d, desc); err != nil {
			return err
		}
		before, _ = countFDs()
	}
	m, err := Open(context.Background(), desc, d, 0, OpenOptions{Fetch: transportsFromEnv()})
	if os.Getenv(envExpectFail) != "" {
		return reportOpenFailure(m, err)
	}
	if err != nil {
		return err
	}
	first := make([]byte, 4096)
	if err := d.CopyDtoH(first, m.Ptr()); err != nil {
		return err
	}
	if os.Getenv(envWarmOpen) == "" {
		fmt.Printf("t1=%d\n", time.Now().UnixNano())
	}
	fmt.Printf("via=%s\nleased=%t\nclaimed=%t\nuid=%d\n", m.Via(), m.Leased(), m.Claimed(), os.Getuid())
	if err := readPattern(d, m.Ptr(), m.Len(), seedParent); err != nil {
		return errors.Join(err, m.Close())
	}
	if err := writePattern(d, m.Ptr(), m.Len(), seedChild); err != nil {
		return errors.Join(err, m.Close())
	}
	fmt.Println("written")
	if !in.Scan() || in.Text() != "close" {
		return errors.Join(fmt.Errorf("want close on stdin, got %q", in.Text()), m.Close())
	}
	err = errors.Join(m.Close(), m.Close())
	after, _ := countFDs() // the driver's own descriptors count in both
	fmt.Printf("usage=%v\n", d.Usage())
	fmt.Printf("fds=%d,%d\nclosed\n", before, after)
	return errors.Join(err, d.Close())
}

// checkEPERM, when the parent asks, checks that pidfd_getfd is refused.
func checkEPERM(desc []byte) error {
	if os.Getenv(envEPERM) == "" {
		return nil
	}
	d, err := handles.ParseDescriptor(desc)
	if err != nil {
		return err
	}
	_, err = Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportPidfd}})
	if !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("pidfd under uid %d: want EPERM, got %v", os.Getuid(), err)
	}
	fmt.Println("pidfd=EPERM")
	return nil
}

func reportOpenFailure(m *Mapping, err error) error {
	if err == nil {
		return errors.Join(fmt.Errorf("open under uid %d succeeded", os.Getuid()), m.Close())
	}
	fmt.Printf("refused=%t\neperm=%t\nerr=%s\n", errors.Is(err, ErrRefused), errors.Is(err, unix.EPERM), strings.ReplaceAll(err.Error(), "\n", " | "))
	return nil
}

func transportsFromEnv() FetchOptions {
	var opts FetchOptions
	for _, name := range strings.Split(os.Getenv(envTransports), ",") {
		switch name {
		case "pidfd":
			opts.Transports = append(opts.Transports, TransportPidfd)
		case "socket":
			opts.Transports = append(opts.Transports, TransportSocket)
		}
	}
	return opts
}

// childExportAlloc is an exporter that exits first: a shareable allocator
// over its driver, a block of XSEG_IPC_SIZE bytes with the parent's
// pattern, shared; it prints the descriptor and exits, closing nothing,
// when stdin closes.
func childExportAlloc() error {
	d, err := openDriver(os.Getenv(envBackend))
	if err != nil {
		return err
	}
	cfg := expandable.ClassicConfig()
	cfg.Shareable = true
	a, err := expandable.New(d, 0, cfg, nil)
	if err != nil {
		return err
	}
	size, err := strconv.ParseUint(os.Getenv(envSize), 10, 64)
	if err != nil {
		return err
	}
	ptr, err := a.Alloc(size, 0)
	if err == nil {
		err = writePattern(d, ptr, size, seedParent)
	}
	if err != nil {
		return err
	}
	e, err := NewExporter(ExporterOptions{})
	if err != nil {
		return err
	}
	s, err := e.ShareBlock(d, a, ptr)
	if err != nil {
		return err
	}
	b, err := s.MarshalBinary()
	if err != nil {
		return err
	}
	fmt.Printf("desc=%s\n", hex.EncodeToString(b))
	_, _ = bufio.NewReader(os.Stdin).ReadString(0)
	return nil
}

// openFirstRead opens desc, reads its first bytes, reports the time, and
// closes it again.
func openFirstRead(d vmm.Driver, desc []byte) error {
	m, err := Open(context.Background(), desc, d, 0, OpenOptions{Fetch: transportsFromEnv()})
	if err != nil {
		return fmt.Errorf("warm open: %w", err)
	}
	first := make([]byte, 4096)
	err = d.CopyDtoH(first, m.Ptr())
	fmt.Printf("t1=%d\n", time.Now().UnixNano())
	return errors.Join(err, m.Close())
}
