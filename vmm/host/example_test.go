package host_test

import (
	"fmt"
	"log"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// The driver contract step by step, on a virtual device of 1 GiB: reserve
// addresses, create a physical page, map it, grant access, copy in and
// out, then undo each step in reverse.
func ExampleOpen() {
	d, err := host.Open(host.Options{Capacity: 1 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	info, err := d.DeviceInfo(0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d MiB, pages of %d MiB\n", d.Backend(), info.TotalMemory>>20, info.Granularity>>20)

	page := info.Granularity
	ptr, err := d.Reserve(page, 0) // none -> reserved
	if err != nil {
		log.Fatal(err)
	}
	h, err := d.Create(0, page, vmm.HandleNone)
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Map(ptr, page, h, 0); err != nil { // reserved -> mapped
		log.Fatal(err)
	}
	if err := d.SetAccess(ptr, page, vmm.ReadWrite(0)); err != nil { // mapped -> accessible
		log.Fatal(err)
	}
	if err := d.CopyHtoD(ptr, []byte("on the device")); err != nil {
		log.Fatal(err)
	}
	got := make([]byte, 13)
	if err := d.CopyDtoH(got, ptr); err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(got))
	free, _, err := d.MemInfo(0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("free MiB:", free>>20)

	if err := d.Unmap(ptr, page); err != nil { // -> reserved
		log.Fatal(err)
	}
	if err := d.Release(h); err != nil {
		log.Fatal(err)
	}
	if err := d.Unreserve(ptr, page); err != nil { // -> none
		log.Fatal(err)
	}
	// Output:
	// host: 1024 MiB, pages of 2 MiB
	// on the device
	// free MiB: 1022
}
