//go:build gorgonia

// Command gorgonia uses xseg memory with gorgonia.org/cu: xseg's
// expandable allocator and a growable buffer hand out device memory on the
// device's primary context, and gorgonia's cu, on that same context, fills
// and copies it on a stream of its own. xseg then reads the bytes back and
// checks them. See README.md.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"

	"gorgonia.org/cu"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/vmm"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gorgonia:", err)
		os.Exit(1)
	}
}

func run() error {
	d, err := xseg.OpenDriver("cuda", 0)
	if err != nil {
		return err
	}
	defer d.Close()
	a, err := xseg.Open(xseg.Options{Driver: d})
	if err != nil {
		return err
	}
	defer a.Close()

	// gorgonia on the primary context, the one xseg uses, on this thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev := cu.Device(0)
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return fmt.Errorf("cu: retaining the primary context: %w", err)
	}
	defer dev.ReleasePrimaryCtx()
	if err := cu.SetCurrentContext(ctx); err != nil {
		return err
	}
	stream, err := cu.MakeStream(cu.NonBlocking)
	if err != nil {
		return err
	}
	defer stream.Destroy()

	const n = 64 << 20
	p, err := a.Alloc(2*n, 0)
	if err != nil {
		return err
	}
	defer a.Free(p)
	// cu fills the first half and copies it to the second, on its stream.
	if err := cu.MemsetD8Async(cu.DevicePtr(p), 0x5a, n, stream); err != nil {
		return err
	}
	if err := cu.MemcpyDtoDAsync(cu.DevicePtr(p+n), cu.DevicePtr(p), n, stream); err != nil {
		return err
	}
	if err := stream.Synchronize(); err != nil {
		return err
	}
	if err := expect(d, p.Add(n), n, 0x5a); err != nil {
		return fmt.Errorf("allocator block: %w", err)
	}
	fmt.Printf("allocator block: %d MiB at %v filled and copied by gorgonia/cu, read back by xseg: ok\n", 2*n>>20, p)

	// A growable buffer: cu writes, the buffer grows, cu writes past the
	// old end, and what cu wrote first is still there at the same address.
	buf, err := expandable.NewBuffer(d, 0, 1<<30, expandable.BufferOptions{})
	if err != nil {
		return err
	}
	defer buf.Close()
	if err := buf.Grow(n); err != nil {
		return err
	}
	if err := cu.MemsetD8Async(cu.DevicePtr(buf.Ptr()), 0x11, n, stream); err != nil {
		return err
	}
	if err := buf.Grow(n); err != nil {
		return err
	}
	if err := cu.MemsetD8Async(cu.DevicePtr(buf.Ptr().Add(n)), 0x22, n, stream); err != nil {
		return err
	}
	if err := stream.Synchronize(); err != nil {
		return err
	}
	err = errors.Join(expect(d, buf.Ptr(), n, 0x11), expect(d, buf.Ptr().Add(n), n, 0x22))
	if err != nil {
		return fmt.Errorf("buffer: %w", err)
	}
	fmt.Printf("buffer: grown to %d MiB at %v, both halves written by gorgonia/cu and kept: ok\n", buf.Len()>>20, buf.Ptr())
	return nil
}

// expect checks that n bytes at p all equal v.
func expect(d vmm.Driver, p vmm.DevicePtr, n int, v byte) error {
	got := make([]byte, n)
	if err := d.CopyDtoH(got, p); err != nil {
		return err
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{v}, n)) {
		return fmt.Errorf("%d bytes at %v: not all %#x", n, p, v)
	}
	return nil
}
