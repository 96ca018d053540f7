package fallback_test

import (
	"fmt"
	"log"

	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/vmm/host"
)

// The fallback allocator carves blocks out of plain allocations
// (segments) sized as PyTorch's native allocator sizes them: small
// requests share 2 MiB segments, so a second small block takes no new one.
func ExampleNew() {
	d, err := host.Open(host.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	cfg := fallback.DefaultConfig()
	a, err := fallback.New(d, 0, cfg, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	for range 2 {
		if _, err := a.Alloc(4096, 0); err != nil {
			log.Fatal(err)
		}
	}
	st := a.Stats()
	fmt.Println("blocks:", st.Allocations.All.Current)
	fmt.Println("segments:", st.Segments.All.Current)
	fmt.Println("segment of a 4 KiB request:", fallback.SegmentSize(cfg, 4096))
	fmt.Println("segment of a 30 MiB request:", fallback.SegmentSize(cfg, 30<<20))
	// Output:
	// blocks: 2
	// segments: 1
	// segment of a 4 KiB request: 2097152
	// segment of a 30 MiB request: 31457280
}
