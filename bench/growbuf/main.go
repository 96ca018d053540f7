// Command growbuf measures growing a buffer that keeps its address: an
// expandable.Buffer grown from -from to -to bytes in -step steps, beside
// the allocate-copy-free growth a plain allocator forces (vmm.Driver
// MemAlloc of the new size, CopyDtoD of the old contents, MemFree of the
// old allocation) over the same steps, in one run. Each step's new region
// gets its own byte pattern; at the end the whole buffer is copied back to
// the host and checked, so the run proves that growing kept the address
// and the data.
//
//	growbuf -backend cuda -from 1GiB -to 16GiB -step 2MiB
//
// It runs on the host backend too (-backend host), for tests.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bytesize"
	"github.com/xseg-dev/xseg/vmm"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "growbuf:", err)
		os.Exit(1)
	}
}

// config is what one run measures.
type config struct {
	backend          xseg.Backend
	dev              vmm.Device
	from, to, step   uint64
	baseline, verify bool
}

func run(args []string, out io.Writer) error {
	c, err := parseFlags(args)
	if err != nil {
		return err
	}
	d, err := xseg.OpenDriver(c.backend, 0)
	if err != nil {
		return err
	}
	err = measure(d, c, out)
	return errors.Join(err, d.Close())
}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("growbuf", flag.ContinueOnError)
	c := config{}
	from, to, step := bytesize.Flag(1<<30), bytesize.Flag(16<<30), bytesize.Flag(2<<20)
	dev := fs.Int("device", 0, "device ordinal")
	fs.TextVar(&c.backend, "backend", xseg.BackendAuto, "backend: auto, cuda or host")
	fs.Var(&from, "from", "starting size: "+bytesize.Syntax)
	fs.Var(&to, "to", "final size: "+bytesize.Syntax)
	fs.Var(&step, "step", "bytes added by each grow: "+bytesize.Syntax)
	fs.BoolVar(&c.baseline, "baseline", true, "also measure allocate-copy-free growth")
	fs.BoolVar(&c.verify, "verify", true, "copy the contents back at the end and check them")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.dev, c.from, c.to, c.step = vmm.Device(*dev), uint64(from), uint64(to), uint64(step)
	if c.step == 0 || c.from == 0 || c.to < c.from || (c.to-c.from)%c.step != 0 || c.from%c.step != 0 {
		return c, fmt.Errorf("-from %d, -to %d, -step %d: want 0 < from <= to, both multiples of step: %w", c.from, c.to, c.step, vmm.ErrInvalid)
	}
	return c, nil
}

func measure(d vmm.Driver, c config, out io.Writer) error {
	info, err := d.DeviceInfo(c.dev)
	if err != nil {
		return err
	}
	steps := (c.to - c.from) / c.step
	fmt.Fprintf(out, "growbuf: backend %s, device %d (%s), %s -> %s in %s steps (%d grows)\n",
		d.Backend(), c.dev, info.Name, bytesize.Format(c.from), bytesize.Format(c.to), bytesize.Format(c.step), steps)
	b, err := growBuffer(d, c)
	if err != nil {
		return fmt.Errorf("expandable.Buffer: %w", err)
	}
	fmt.Fprintln(out, b.line(c, "expandable.Buffer.Grow"))
	if !c.baseline {
		return nil
	}
	p, err := growPlain(d, c)
	if err != nil {
		return fmt.Errorf("MemAlloc+CopyDtoD+MemFree: %w", err)
	}
	fmt.Fprintln(out, p.line(c, "MemAlloc+CopyDtoD+MemFree"))
	fmt.Fprintf(out, "per grow, plain / buffer: %.1fx (mean), %.1fx (first %s), %.1fx (last %s)\n",
		p.mean()/b.mean(), p.head.mean()/b.head.mean(), bytesize.Format(window(c)), p.tail.mean()/b.tail.mean(), bytesize.Format(window(c)))
	return nil
}
