package ipc_test

import (
	"context"
	"fmt"
	"log"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/ipc"
	"github.com/xseg-dev/xseg/vmm/host"
)

// Share a block and open it again. The descriptor bytes would normally go
// to another process (over a pipe, a socket, an HTTP call); here the same
// process opens them, and gets the same memory at a second address.
func Example() {
	d, err := host.Open(host.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	buf, err := expandable.NewBuffer(d, 0, 64<<20, expandable.BufferOptions{Shareable: true})
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close()
	if err := buf.Grow(2 << 20); err != nil {
		log.Fatal(err)
	}
	if err := d.CopyHtoD(buf.Ptr(), []byte("hello, importer")); err != nil {
		log.Fatal(err)
	}

	// The exporter's side: share the block, send the descriptor.
	e, err := ipc.NewExporter(ipc.ExporterOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	share, err := e.ShareBlock(d, buf, buf.Ptr())
	if err != nil {
		log.Fatal(err)
	}
	desc, err := share.MarshalBinary()
	if err != nil {
		log.Fatal(err)
	}

	// The importer's side: map the descriptor's block.
	m, err := ipc.Open(context.Background(), desc, d, 0, ipc.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	got := make([]byte, 15)
	if err := d.CopyDtoH(got, m.Ptr()); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(got))
	fmt.Println("mapped MiB:", m.Len()>>20)
	fmt.Println("another address:", m.Ptr() != buf.Ptr())

	// Writes go both ways: it is one memory.
	if err := d.CopyHtoD(m.Ptr(), []byte("HELLO")); err != nil {
		log.Fatal(err)
	}
	if err := d.CopyDtoH(got, buf.Ptr()); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(got))
	// Output:
	// hello, importer
	// mapped MiB: 2
	// another address: true
	// HELLO, importer
}
