package expandable_test

import (
	"fmt"
	"log"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/vmm/host"
)

// A Buffer grows in place: its address and contents stay where they are,
// so nothing is copied and pointers into it stay valid.
func ExampleBuffer() {
	d, err := host.Open(host.Options{}) // plain memory standing in for a GPU
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	b, err := expandable.NewBuffer(d, 0, 1<<30, expandable.BufferOptions{}) // up to 1 GiB
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	if err := b.Grow(1 << 20); err != nil {
		log.Fatal(err)
	}
	if err := d.CopyHtoD(b.Ptr(), []byte("hello")); err != nil {
		log.Fatal(err)
	}
	start := b.Ptr()

	if err := b.Grow(4 << 20); err != nil { // 4 MiB more
		log.Fatal(err)
	}
	got := make([]byte, 5)
	if err := d.CopyDtoH(got, b.Ptr()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("same address:", b.Ptr() == start)
	fmt.Println("contents:", string(got))
	fmt.Printf("len %d MiB, cap %d MiB, max %d MiB\n", b.Len()>>20, b.Cap()>>20, b.Max()>>20)
	// Output:
	// same address: true
	// contents: hello
	// len 5 MiB, cap 6 MiB, max 1024 MiB
}

// Shrink gives the whole pages past the new length back to the device.
func ExampleBuffer_Shrink() {
	d, err := host.Open(host.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	b, err := expandable.NewBuffer(d, 0, 1<<30, expandable.BufferOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	if err := b.Grow(9 << 20); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("len %d MiB, cap %d MiB\n", b.Len()>>20, b.Cap()>>20)
	if err := b.Shrink(6 << 20); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("len %d MiB, cap %d MiB\n", b.Len()>>20, b.Cap()>>20)
	// Output:
	// len 9 MiB, cap 10 MiB
	// len 3 MiB, cap 4 MiB
}
