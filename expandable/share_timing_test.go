package expandable

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/ipc"
	"github.com/xseg-dev/xseg/vmm"
)

// TestShareTimings logs what sharing a 1 GiB block costs, step by step, on
// the benchmark backend (XSEG_BENCH_BACKEND=cuda on the GPU machine): the
// figures behind the torch.multiprocessing timing of bench/RESULTS.md. It
// asserts only that every step works; the times are for reading.
func TestShareTimings(t *testing.T) {
	if os.Getenv("XSEG_BENCH_BACKEND") != "cuda" {
		t.Skip("times the CUDA backend: set XSEG_BENCH_BACKEND=cuda")
	}
	d := benchDriver(t)
	cfg := ClassicConfig()
	cfg.Shareable = true
	a := newAlloc(t, d, cfg)
	p, err := a.Alloc(1<<30, 0)
	require.NoError(t, err)
	step := func(name string, n int, fn func()) {
		t0 := time.Now()
		fn()
		el := time.Since(t0)
		t.Logf("%-28s %8.1f us total, %6.1f us each (%d)", name, float64(el.Microseconds()), float64(el.Microseconds())/float64(max(n, 1)), n)
	}
	pin, err := a.PinBlock(p)
	require.NoError(t, err)
	pages := pin.Pages
	step("DeviceInfo", 1, func() { _, err = d.DeviceInfo(0); require.NoError(t, err) })
	step("ExportFabric (1 page)", 1, func() { _, _ = d.ExportFabric(pages[0]) })
	fds := make([]int, len(pages))
	step("ExportFD", len(pages), func() {
		for i, h := range pages {
			fds[i], err = d.ExportFD(h)
			require.NoError(t, err)
		}
	})
	hs := make([]vmm.Handle, len(pages))
	step("ImportFD", len(pages), func() {
		for i, fd := range fds {
			hs[i], err = d.ImportFD(fd)
			require.NoError(t, err)
		}
	})
	ps := pin.PageSize
	var base vmm.DevicePtr
	step("Reserve", 1, func() { base, err = d.Reserve(uint64(len(pages))*ps, 0); require.NoError(t, err) })
	step("Map", len(pages), func() {
		for i, h := range hs {
			require.NoError(t, d.Map(base.Add(uint64(i)*ps), ps, h, 0))
		}
	})
	step("SetAccess (whole range)", 1, func() {
		require.NoError(t, d.SetAccess(base, uint64(len(pages))*ps, []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessReadWrite}}))
	})
	step("Unmap", len(pages), func() {
		for i := range hs {
			require.NoError(t, d.Unmap(base.Add(uint64(i)*ps), ps))
		}
	})
	step("Release imported", len(pages), func() {
		for _, h := range hs {
			require.NoError(t, d.Release(h))
		}
	})
	require.NoError(t, d.Unreserve(base, uint64(len(pages))*ps))
	step("close fds", len(fds), func() {
		for _, fd := range fds {
			require.NoError(t, closeFD(fd))
		}
	})
	require.NoError(t, pin.Unpin())

	exp, err := ipc.NewExporter(ipc.ExporterOptions{})
	require.NoError(t, err)
	defer exp.Close()
	for i := range 3 {
		var sh *ipc.Share
		step("ShareBlock", len(pages), func() { sh, err = exp.ShareBlock(d, a, p); require.NoError(t, err) })
		desc, err := sh.MarshalBinary()
		require.NoError(t, err)
		var m *ipc.Mapping
		step("ipc.Open (from self)", len(pages), func() {
			m, err = ipc.Open(context.Background(), desc, d, 0, ipc.OpenOptions{})
			require.NoError(t, err)
		})
		t.Logf("round %d via %v", i, m.Via())
		step("Mapping.Close", len(pages), func() { require.NoError(t, m.Close()) })
		step("Share.Close", 1, func() { require.NoError(t, sh.Close()) })
	}
	require.NoError(t, a.Free(p))
}
