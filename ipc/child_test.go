//go:build linux

package ipc

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
)

// Child processes re-run this test binary with -test.run=^TestHelperChild$
// and these variables set; they report "key=value" lines on stdout.
const (
	envRole       = "XSEG_IPC_CHILD"      // import, import-refused, export
	envDesc       = "XSEG_IPC_DESC"       // descriptor, hex
	envTransports = "XSEG_IPC_TRANSPORTS" // comma-separated; empty: auto
	envEPERM      = "XSEG_IPC_EXPECT_EPERM"
	seedParent    = 1 // pattern the parent (or exporter) writes
	seedChild     = 2 // pattern the importer writes
	childTimeout  = 60 * time.Second
)

func TestMain(m *testing.M) {
	// Start the network poller now, so its descriptors are not counted as
	// a leak by the first test that uses a socket.
	if ln, err := net.Listen("unixpacket", "@xseg-ipc-test-warmup-"+strconv.Itoa(os.Getpid())); err == nil {
		_ = ln.Close()
	}
	os.Exit(m.Run())
}

// TestHelperChild is the child side of the cross-process tests; it does
// nothing unless started by one of them.
func TestHelperChild(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		return
	}
	var err error
	switch role {
	case "import":
		err = childImport()
	case "import-refused":
		err = childImportRefused()
	case "export":
		err = childExport()
	default:
		if f := allocRoles[role]; f != nil {
			err = f()
		} else {
			err = fmt.Errorf("unknown role %q", role)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func childDescriptor() (*handles.Descriptor, FetchOptions, error) {
	b, err := hex.DecodeString(os.Getenv(envDesc))
	if err != nil {
		return nil, FetchOptions{}, err
	}
	d, err := handles.ParseDescriptor(b)
	var opts FetchOptions
	for _, name := range strings.Split(os.Getenv(envTransports), ",") {
		switch name {
		case "pidfd":
			opts.Transports = append(opts.Transports, TransportPidfd)
		case "socket":
			opts.Transports = append(opts.Transports, TransportSocket)
		}
	}
	return d, opts, err
}

// childImport fetches the pages, checks the parent's pattern and writes its
// own over the block, then reports the transport and its fd counts.
func childImport() error {
	d, opts, err := childDescriptor()
	if err != nil {
		return err
	}
	before, _ := countFDs()
	if os.Getenv(envEPERM) != "" {
		_, err := Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportPidfd}})
		if !errors.Is(err, unix.EPERM) {
			return fmt.Errorf("pidfd under uid %d: want EPERM, got %v", os.Getuid(), err)
		}
		fmt.Println("pidfd=EPERM")
	}
	r, err := Fetch(context.Background(), d, opts)
	if err != nil {
		return err
	}
	m, err := mapPages(r.FDs, d.PageSize, d.Offset, d.Length)
	if err == nil {
		err = checkPattern(m.block, seedParent)
		fillPattern(m.block, seedChild)
		err = errors.Join(err, m.unmap())
	}
	err = errors.Join(err, r.Close())
	after, _ := countFDs()
	fmt.Printf("via=%s\nuid=%d\nfds=%d,%d\n", r.Via, os.Getuid(), before, after)
	return err
}

// childImportRefused expects every transport to fail and reports the error.
func childImportRefused() error {
	d, opts, err := childDescriptor()
	if err != nil {
		return err
	}
	r, err := Fetch(context.Background(), d, opts)
	if err == nil {
		_ = r.Close()
		return fmt.Errorf("fetch under uid %d succeeded", os.Getuid())
	}
	fmt.Printf("refused=%t\neperm=%t\nerr=%s\n", errors.Is(err, ErrRefused), errors.Is(err, unix.EPERM), strings.ReplaceAll(err.Error(), "\n", " | "))
	return nil
}

// childExport shares 4 pages with the parent's pattern, prints the
// descriptor, and exits (without closing anything) when stdin closes.
func childExport() error {
	const pageSize, pages = 1 << 20, 4
	fds := make([]*handles.FD, pages)
	for i := range fds {
		var err error
		if fds[i], err = sealedMemfd("xseg-export", pageSize); err != nil {
			return err
		}
	}
	m, err := mapPages(fds, pageSize, 0, pageSize*pages)
	if err != nil {
		return err
	}
	fillPattern(m.block, seedParent)
	e, err := NewExporter(ExporterOptions{})
	if err != nil {
		return err
	}
	s, err := e.ShareFDs(fds, Extent{PageSize: pageSize, Length: pageSize * pages}, nil)
	if err != nil {
		return err
	}
	return announce(s)
}

// announce prints a child's share's descriptor for its parent and serves
// it until the parent closes stdin.
func announce(s *Share) error {
	b, err := s.MarshalBinary()
	if err != nil {
		return err
	}
	fmt.Printf("desc=%s\n", hex.EncodeToString(b))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// child is a running helper process.
type child struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	out    strings.Builder
	errOut strings.Builder
}

// newChild prepares the test binary as a child in role; uid, if not nil,
// runs it as that uid and gid (the binary is copied where it can read it).
func newChild(t *testing.T, role string, uid *uint32, env ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	dir := ""
	if uid != nil {
		exe, dir = copyExecutable(t, exe)
	}
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	c := &child{cancel: cancel}
	c.cmd = exec.CommandContext(ctx, exe, "-test.run=^TestHelperChild$", "-test.v=false")
	c.cmd.Env = append(os.Environ(), append(env, envRole+"="+role)...)
	c.cmd.Dir = dir
	c.cmd.Stderr = &c.errOut
	if uid != nil {
		c.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: *uid, Gid: *uid}}
	}
	t.Cleanup(cancel)
	return c
}

// run runs the child to completion and returns its key=value report.
func (c *child) run(t *testing.T) map[string]string {
	t.Helper()
	c.cmd.Stdout = &c.out
	err := c.cmd.Run()
	require.NoError(t, err, "child failed: %s", c.errOut.String())
	return parseReport(c.out.String())
}

func parseReport(s string) map[string]string {
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	return kv
}

// copyExecutable copies the test binary into a world-readable directory,
// so a child under another uid can run it.
func copyExecutable(t *testing.T, exe string) (string, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "xseg-ipc-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	src, err := os.ReadFile(exe)
	require.NoError(t, err)
	dst := filepath.Join(dir, "ipc.test")
	require.NoError(t, os.WriteFile(dst, src, 0o755))
	return dst, dir
}

func descEnv(t *testing.T, s *Share) string {
	t.Helper()
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	return envDesc + "=" + hex.EncodeToString(b)
}

// requireChildFDs checks the child's "fds=before,after" report.
func requireChildFDs(t *testing.T, rep map[string]string) {
	t.Helper()
	before, after, ok := strings.Cut(rep["fds"], ",")
	require.True(t, ok, "child report %v", rep)
	require.Equal(t, before, after, "child leaked fds")
}

// startExporterChild starts a child in role (with env), reads the
// descriptor it prints ("desc=<hex>") and returns it with the child and
// its stdin, whose close tells the child to exit.
func startExporterChild(t *testing.T, role string, env ...string) (*child, io.WriteCloser, []byte) {
	t.Helper()
	c := newChild(t, role, nil, env...)
	stdin, err := c.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "child: %s", c.errOut.String())
	desc, err := hex.DecodeString(strings.TrimSpace(strings.TrimPrefix(line, "desc=")))
	require.NoError(t, err)
	return c, stdin, desc
}
