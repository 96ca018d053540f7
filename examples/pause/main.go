// Command pause is a model server that gives its GPU memory back while it
// is idle, and takes it again at the same addresses when a request comes:
// xseg's tags, Pause and Resume (xseg.Tagger). The weights are paused with
// a host backup, the KV cache without. See README.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/xseg-dev/xseg"
)

func main() {
	backend := xseg.BackendHost
	flag.TextVar(&backend, "backend", xseg.BackendHost, "host (plain memory standing in for a GPU), cuda or auto")
	idle := flag.Duration("idle", 200*time.Millisecond, "pause after this long without a request")
	flag.Parse()
	if err := run(os.Stdout, xseg.Options{Backend: backend}, *idle); err != nil {
		fmt.Fprintln(os.Stderr, "pause:", err)
		os.Exit(1)
	}
}

const (
	weightBytes = 64 << 20
	cacheBytes  = 128 << 20
)

// run serves a burst of requests, stays idle until the service pauses,
// and serves one more, printing what the allocator holds at each step.
func run(out io.Writer, opts xseg.Options, idle time.Duration) (err error) {
	cfg := xseg.DefaultConfig()
	opts.Config = &cfg
	a, err := xseg.Open(opts)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	s, err := newService(a, weightBytes, cacheBytes, idle)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()

	report := func(when string) {
		free, _, merr := a.Driver().MemInfo(a.Device())
		paused, sleeps, wakes := s.Sleeping()
		fmt.Fprintf(out, "%-22s reserved %4d MiB, device free %s, paused %v (%d pauses, %d resumes)\n",
			when+":", a.Stats().ReservedBytes.All.Current>>20, mib(free, merr), paused, sleeps, wakes)
	}
	first, err := s.Query(12345)
	if err != nil {
		return err
	}
	for i := range uint64(100) {
		if _, err := s.Query(i * 4099); err != nil {
			return err
		}
	}
	report("after 101 requests")
	for deadline := time.Now().Add(20 * idle); ; time.Sleep(idle / 4) {
		if paused, _, _ := s.Sleeping(); paused {
			break
		}
		if err := s.pauseErr(); err != nil {
			return fmt.Errorf("the service could not pause: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the service did not pause after %v idle", 20*idle)
		}
	}
	report("idle")
	again, err := s.Query(12345)
	if err != nil {
		return err
	}
	report("after one more")
	st, err := a.TagStats("weights")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "weight 12345: %d before the pause, %d after (want %d), at the same address; weights remapped %d time(s)\n",
		first, again, weightByte(12345), st.Remaps)
	if first != again || again != weightByte(12345) {
		return fmt.Errorf("the weights changed across the pause")
	}
	return nil
}

// mib prints a device's free memory in MiB; the host backend reports its
// configured capacity less the pages made.
func mib(free uint64, err error) string {
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%d MiB", free>>20)
}
