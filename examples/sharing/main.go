// Command sharing is a producer and a consumer process sharing one
// growable buffer without a copy: the producer fills an
// expandable.Buffer made Shareable, shares its pages with
// ipc.Exporter.ShareBlock, and starts the consumer (this program again,
// "sharing consume") with the descriptor on its standard input; the
// consumer fetches the page fds (pidfd_getfd, or the exporter's Unix
// socket), maps them into its own address space and reads the data. See
// README.md.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/ipc"
	"github.com/xseg-dev/xseg/vmm"
)

func main() {
	var backend xseg.Backend
	flag.TextVar(&backend, "backend", xseg.BackendAuto, "auto (CUDA if it opens, else host), cuda or host")
	flag.Parse()
	var err error
	if flag.Arg(0) == "consume" {
		err = consume(backend, os.Stdin, os.Stdout)
	} else {
		self, _ := os.Executable()
		err = produce(backend, os.Stdout, func() *exec.Cmd { return exec.Command(self, "-backend", string(backend), "consume") })
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sharing:", err)
		os.Exit(1)
	}
}

// message opens the shared data; the rest of each page is a pattern.
const message = "hello from the producer"

// fillByte is the pattern: byte i of the buffer (past the message).
func fillByte(i uint64) byte { return byte(i*31 + i>>12) }

// produce makes and fills the buffer, shares it, runs the consumer that
// consumer() makes with the descriptor on its stdin and its output on out,
// and waits for it.
func produce(backend xseg.Backend, out io.Writer, consumer func() *exec.Cmd) error {
	d, err := xseg.OpenDriver(backend, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	buf, err := expandable.NewBuffer(d, 0, 1<<30, expandable.BufferOptions{Shareable: true})
	if err != nil {
		return err
	}
	defer buf.Close()
	const size = 5<<20 + 123
	if err := buf.Grow(size); err != nil {
		return err
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = fillByte(uint64(i))
	}
	copy(data, message)
	if err := d.CopyHtoD(buf.Ptr(), data); err != nil {
		return err
	}
	exp, err := ipc.NewExporter(ipc.ExporterOptions{})
	if err != nil {
		return err
	}
	defer exp.Close()
	share, err := exp.ShareBlock(d, buf, buf.Ptr())
	if err != nil {
		return err
	}
	defer share.Close()
	desc, err := share.MarshalBinary()
	if err != nil {
		return err
	}
	dd := share.Descriptor()
	fmt.Fprintf(out, "producer: sharing %d bytes in %d pages of %d MiB (%s backend)\n", dd.Length, dd.PageCount, dd.PageSize>>20, d.Backend())
	cmd := consumer()
	cmd.Stdin = strings.NewReader(hex.EncodeToString(desc) + "\n")
	cmd.Stdout, cmd.Stderr = out, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the consumer: %w", err)
	}
	fmt.Fprintln(out, "producer: the consumer is done")
	return nil
}

// consume reads a descriptor from in, fetches and maps its pages, checks
// the data and reports on out.
func consume(backend xseg.Backend, in io.Reader, out io.Writer) error {
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the descriptor: %w", err)
	}
	raw, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		return err
	}
	desc, err := handles.ParseDescriptor(raw)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := ipc.Fetch(ctx, desc, ipc.FetchOptions{})
	if err != nil {
		return err
	}
	defer got.Close()
	d, err := xseg.OpenDriver(backend, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	data, err := mapAndRead(d, desc, got.FDs)
	if err != nil {
		return err
	}
	for i := len(message); i < len(data); i++ {
		if data[i] != fillByte(uint64(i)) {
			return fmt.Errorf("byte %d is %#x, want %#x", i, data[i], fillByte(uint64(i)))
		}
	}
	fmt.Fprintf(out, "consumer: fetched %d page fds, mapped them, read %q and checked %d bytes\n",
		len(got.FDs), data[:len(message)], len(data))
	return nil
}

// mapAndRead imports the allocations, maps each whole (a chunk holds
// desc.Span(i) pages) at a new reservation of this process, copies the
// shared extent out and undoes everything.
func mapAndRead(d vmm.Driver, desc *handles.Descriptor, fds []*handles.FD) (data []byte, err error) {
	size := desc.Bytes()
	base, err := d.Reserve(size, 0)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, d.Unreserve(base, size)) }()
	type mapped struct {
		at   vmm.DevicePtr
		size uint64
		h    vmm.Handle
	}
	var maps []mapped
	defer func() {
		for _, m := range maps {
			err = errors.Join(err, d.Unmap(m.at, m.size), d.Release(m.h))
		}
	}()
	at := base
	for i, fd := range fds {
		h, err := d.ImportFD(fd.Int())
		if err != nil {
			return nil, fmt.Errorf("importing allocation %d: %w", i, err)
		}
		n := uint64(desc.Span(i)) * desc.PageSize
		if err := d.Map(at, n, h, 0); err != nil {
			return nil, errors.Join(fmt.Errorf("mapping allocation %d: %w", i, err), d.Release(h))
		}
		maps = append(maps, mapped{at, n, h})
		at = at.Add(n)
	}
	if err := d.SetAccess(base, size, vmm.ReadWrite(0)); err != nil {
		return nil, err
	}
	data = make([]byte, desc.Length)
	if err := d.CopyDtoH(data, base.Add(desc.Offset)); err != nil {
		return nil, err
	}
	return data, nil
}
