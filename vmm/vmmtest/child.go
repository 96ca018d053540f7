package vmmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// The child process of the cross-process test learns its role and arguments
// from the environment; its page arrives as fd 3 (the first of ExtraFiles).
const (
	envRole    = "XSEG_VMMTEST_CHILD"
	envDevice  = "XSEG_VMMTEST_DEVICE"
	envSize    = "XSEG_VMMTEST_SIZE"
	roleImport = "import"
	childFD    = 3
	childOK    = "vmmtest child: ok"
	// childTimeout bounds the child; a CUDA child spends seconds starting.
	childTimeout = 2 * time.Minute
	seedParent   = 0x51
	seedChild    = 0xc7
)

// ChildMain runs the child's side of the cross-process tests when this
// process is such a child (the environment variable XSEG_VMMTEST_CHILD is
// set) and exits; otherwise it returns at once. A backend's TestMain calls it
// first, with a function that opens that backend. It is not safe to call
// concurrently and must be called before the tests run.
func ChildMain(open func() (vmm.Driver, error)) {
	role := os.Getenv(envRole)
	if role == "" {
		return
	}
	if err := runChild(role, open); err != nil {
		fmt.Fprintf(os.Stderr, "vmmtest child %q: %v\n", role, err)
		os.Exit(1)
	}
	fmt.Println(childOK)
	os.Exit(0)
}

func runChild(role string, open func() (vmm.Driver, error)) (err error) {
	if role != roleImport {
		return fmt.Errorf("unknown role %q", role)
	}
	dev, err := strconv.Atoi(os.Getenv(envDevice))
	if err != nil {
		return fmt.Errorf("parsing %s: %w", envDevice, err)
	}
	size, err := strconv.ParseUint(os.Getenv(envSize), 10, 64)
	if err != nil {
		return fmt.Errorf("parsing %s: %w", envSize, err)
	}
	d, err := open()
	if err != nil {
		return fmt.Errorf("opening the driver: %w", err)
	}
	fds, fdErr := openFDs()
	defer func() {
		if u := d.Usage(); err == nil && !u.Zero() {
			err = fmt.Errorf("the child leaked: %v", u)
		}
		if after, aerr := openFDs(); err == nil && fdErr == nil && aerr == nil {
			if leaked := newFDs(fds, after); len(leaked) > 0 {
				err = fmt.Errorf("the child leaked file descriptors: %v", leaked)
			}
		}
		err = errors.Join(err, d.Close())
	}()
	h, err := d.ImportFD(childFD)
	if cerr := os.NewFile(childFD, "vmmtest-imported-page").Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("closing fd %d: %w", childFD, cerr))
	}
	if err != nil {
		return fmt.Errorf("importing fd %d: %w", childFD, err)
	}
	defer func() { err = errors.Join(err, d.Release(h)) }()
	return childUse(d, vmm.Device(dev), h, size)
}

// childUse maps the imported page, checks the parent's bytes and writes the
// reply, then unmaps it.
func childUse(d vmm.Driver, dev vmm.Device, h vmm.Handle, size uint64) (err error) {
	p, err := d.Reserve(size, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Unreserve(p, size)) }()
	if err := d.Map(p, size, h, 0); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Unmap(p, size)) }()
	if err := d.SetAccess(p, size, vmm.ReadWrite(dev)); err != nil {
		return err
	}
	got := make([]byte, size)
	if err := d.CopyDtoH(got, p); err != nil {
		return err
	}
	if want := pattern(int(size), seedParent); !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		return fmt.Errorf("the parent's bytes differ first at offset %d: got %#x, want %#x", i, got[i], want[i])
	}
	return d.CopyHtoD(p, pattern(int(size), seedChild))
}

// testCrossProcess exports a page to a child process, which checks the
// bytes the parent wrote and writes its reply through its own mapping.
func testCrossProcess(t *testing.T, c Config) {
	if !c.CrossProcess {
		t.Skipf("%s: Config.CrossProcess is off", c.Name)
	}
	e := open(t, c)
	e.need(e.info.PosixFD, "%s: device %d reports no POSIX fd handles", c.Name, e.dev)
	size := 2 * e.gran
	h := e.create(size, vmm.HandlePosixFD)
	p := e.reserve(size)
	e.mapRW(p, size, h, 0)
	e.write(p, pattern(int(size), seedParent))
	f := e.exportFD(h)

	exe, err := os.Executable()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), childTimeout)
	defer cancel()
	// -test.run=^$: a binary whose TestMain forgot ChildMain runs no test
	// (and no child of its own) and prints no childOK.
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envRole+"="+roleImport,
		envDevice+"="+strconv.Itoa(int(e.dev)),
		envSize+"="+strconv.FormatUint(size, 10))
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child process failed; its output:\n%s", out)
	require.Contains(t, string(out), childOK, "child did not run its role: does TestMain call vmmtest.ChildMain? Its output:\n%s", out)
	require.NoError(t, f.Close())
	want := pattern(int(size), seedChild)
	require.True(t, bytes.Equal(want, e.read(p, int(size))), "the child's reply, read through the parent's mapping")
}
