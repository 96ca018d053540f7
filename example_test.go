package xseg_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// Open an allocator on the host backend (plain memory standing in for a
// GPU), take a block, give it back, and read the statistics.
func Example() {
	cfg := xseg.DefaultConfig() // the defaults, not XSEG_CONF's
	a, err := xseg.Open(xseg.Options{Backend: "host", Config: &cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	p, err := a.Alloc(3<<20, 0) // 3 MiB on the default stream
	if err != nil {
		log.Fatal(err)
	}
	st := a.Stats()
	fmt.Println("allocator:", xseg.Kind(a))
	fmt.Println("allocated:", st.AllocatedBytes.All.Current)
	fmt.Println("requested:", st.RequestedBytes.All.Current)

	if err := a.Free(p); err != nil {
		log.Fatal(err)
	}
	st = a.Stats()
	fmt.Println("allocated after Free:", st.AllocatedBytes.All.Current)
	fmt.Println("peak:", st.AllocatedBytes.All.Peak)
	// Output:
	// allocator: expandable
	// allocated: 3145728
	// requested: 3145728
	// allocated after Free: 0
	// peak: 3145728
}

// A configuration in the syntax of the XSEG_CONF environment variable,
// applied over the defaults. An unknown key is an error that names it.
func ExampleParseConfig() {
	cfg, err := xseg.ParseConfig(xseg.DefaultConfig(), "large_page_mb:8,oom_max_retries:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("large pages:", cfg.LargePageSize>>20, "MiB")
	fmt.Println("OOM retries:", cfg.OOMMaxRetries)

	_, err = xseg.ParseConfig(xseg.DefaultConfig(), "large_page_mib:8")
	fmt.Println(err)
	// Output:
	// large pages: 8 MiB
	// OOM retries: 0
	// config: unknown key "large_page_mib" (the keys: chunk_mb, chunk_min_mb, large_page_mb, oom_delay_ms, oom_max_retries, oom_size_factor, oom_verbose, oom_wait_ms, pack_long_lived, page_cache_mb, policy, recycle_pages, release_threshold_mb, settle_chains, shareable, size_classes, small_limit_kb, small_page_mb, whole_pages): invalid argument
}

// When memory runs out, Alloc fails with an error matching
// vmm.ErrOutOfMemory, after the OOM policy has emptied the cache (and,
// with OOMMaxRetries, waited for other processes to free memory).
func ExampleAllocator_Alloc_outOfMemory() {
	cfg := xseg.DefaultConfig() // no OOM retries
	a, err := xseg.Open(xseg.Options{Backend: "host", HostCapacity: 64 << 20, Config: &cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	_, err = a.Alloc(1<<30, 0) // 1 GiB on a 64 MiB device
	fmt.Println("out of memory:", errors.Is(err, vmm.ErrOutOfMemory))
	fmt.Println("OOMs counted:", a.Stats().NumOOMs)
	// Output:
	// out of memory: true
	// OOMs counted: 1
}

// AllocAtMost takes as large a block as it can get between a minimum and
// a maximum: a cache that wants as much as the device holds asks for it
// this way instead of guessing. The first try asks for no more than the
// device's free memory and the bytes the allocator holds unused, so on an
// idle 64 MiB device it gets all 64 MiB; each failed try shrinks the
// request by Config.OOMSizeFactor (0.8), and by at least 1/64 of the
// maximum.
func ExampleAllocator_AllocAtMost() {
	cfg := xseg.DefaultConfig() // no OOM retries
	a, err := xseg.Open(xseg.Options{Backend: "host", HostCapacity: 64 << 20, Config: &cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	p, size, err := a.AllocAtMost(1<<30, 16<<20, 0) // 16 MiB to 1 GiB
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("got MiB:", size>>20)
	if err := a.Free(p); err != nil {
		log.Fatal(err)
	}
	// Output:
	// got MiB: 64
}

// A memory limit caps what the allocator reserves, as PyTorch's
// set_per_process_memory_fraction does.
func ExampleLimiterOf() {
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Backend: "host", HostCapacity: 1 << 30, Config: &cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	lim, err := xseg.LimiterOf(a)
	if err != nil {
		log.Fatal(err)
	}
	if err := lim.SetMemoryFraction(0.25); err != nil {
		log.Fatal(err)
	}
	fmt.Println("limit MiB:", lim.MemoryLimit()>>20)

	_, err = a.Alloc(512<<20, 0)
	fmt.Println("512 MiB past the limit:", errors.Is(err, vmm.ErrOutOfMemory))
	p, err := a.Alloc(128<<20, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("reserved MiB:", a.Stats().ReservedBytes.All.Current>>20) // 64 pages of 2 MiB
	if err := a.Free(p); err != nil {
		log.Fatal(err)
	}
	// Output:
	// limit MiB: 256
	// 512 MiB past the limit: true
	// reserved MiB: 128
}

// Any allocator can be forced by name: fallback hands out blocks of
// plain allocations (segments), for devices without virtual memory
// management.
func ExampleOpen_fallback() {
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Backend: "host", Allocator: "fallback", Config: &cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	p, err := a.Alloc(1000, 0)
	if err != nil {
		log.Fatal(err)
	}
	st := a.Stats()
	fmt.Println("allocator:", xseg.Kind(a))
	fmt.Println("segments:", st.Segments.All.Current)
	fmt.Println("reserved:", st.ReservedBytes.All.Current) // one 2 MiB segment
	if err := a.Free(p); err != nil {
		log.Fatal(err)
	}
	// Output:
	// allocator: fallback
	// segments: 1
	// reserved: 2097152
}
