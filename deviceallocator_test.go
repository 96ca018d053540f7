package xseg_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/ipc"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// Issue 16 item 2: what Open returns (with the driver it opened) used to
// be a wrapper that was neither an ipc.BlockSource nor a PeerAccessor.
// Now it is one type with every capability, for both allocators.
func TestOpenedAllocatorHasEveryCapability(t *testing.T) {
	for _, kind := range []xseg.AllocatorKind{xseg.AllocatorExpandable, xseg.AllocatorFallback} {
		t.Run(string(kind), func(t *testing.T) {
			cfg := xseg.DefaultConfig()
			cfg.Shareable = true
			a, err := xseg.Open(xseg.Options{Backend: xseg.BackendHost, Allocator: kind, HostCapacity: 1 << 30, Config: &cfg})
			require.NoError(t, err)
			require.Equal(t, kind, a.Kind())
			var plain xseg.Allocator = a
			for name, ok := range map[string]bool{
				"ipc.BlockSource":    is[ipc.BlockSource](plain),
				"xseg.PeerAccessor":  is[xseg.PeerAccessor](plain),
				"xseg.Pools":         is[xseg.Pools](plain),
				"xseg.MemoryLimiter": is[xseg.MemoryLimiter](plain),
				"xseg.Historian":     is[xseg.Historian](plain),
			} {
				require.True(t, ok, "Open's allocator is not a %s", name)
			}
			_, err = xseg.PoolsOf(plain)
			require.NoError(t, err)

			shareAndMap(t, a)

			// One device: no peer to grant. Expandable checks the peer,
			// fallback cannot grant any.
			err = a.EnablePeerAccess(1)
			if kind == xseg.AllocatorFallback {
				require.ErrorIs(t, err, vmm.ErrNotSupported)
				require.ErrorContains(t, err, "fallback allocator cannot grant it")
				require.ErrorIs(t, a.DisablePeerAccess(1), vmm.ErrNotSupported)
			} else {
				require.ErrorIs(t, err, vmm.ErrInvalid)
			}

			d := a.Driver()
			require.NoError(t, a.Close())
			_, err = d.DeviceCount()
			require.ErrorIs(t, err, vmm.ErrClosed, "Close closes the driver Open opened")
			require.NoError(t, a.Close(), "a second Close")
		})
	}
}

func is[T any](a xseg.Allocator) bool {
	_, ok := a.(T)
	return ok
}

// shareAndMap shares a block of a through ipc, as a BlockSource, maps it
// in this process and reads the bytes back through the mapping.
func shareAndMap(t *testing.T, a *xseg.DeviceAllocator) {
	t.Helper()
	p, err := a.Alloc(4096, 0)
	require.NoError(t, err)
	want := []byte("shared through Open's allocator")
	require.NoError(t, a.Driver().CopyHtoD(p, want))

	exp, err := ipc.NewExporter(ipc.ExporterOptions{})
	require.NoError(t, err)
	defer func() { require.NoError(t, exp.Close()) }()
	sh, err := exp.ShareBlock(a.Driver(), a, p)
	require.NoError(t, err)
	require.Equal(t, 1, a.Pinned())
	desc, err := sh.MarshalBinary()
	require.NoError(t, err)
	m, err := ipc.Open(context.Background(), desc, a.Driver(), a.Device(), ipc.OpenOptions{})
	require.NoError(t, err)
	got := make([]byte, len(want))
	require.NoError(t, a.Driver().CopyDtoH(got, m.Ptr()))
	require.Equal(t, want, got)
	require.NoError(t, m.Close())
	require.NoError(t, sh.Close())
	require.NoError(t, a.Free(p))
	// The exporter learns asynchronously that the importer's lease ended.
	require.Eventually(t, func() bool { return a.Pinned() == 0 }, 10*time.Second, time.Millisecond, "the share let the block go")
}

// Peer access through Open's allocator, on a driver of two devices:
// expandable grants it, fallback says it cannot.
func TestOpenedAllocatorPeerAccess(t *testing.T) {
	d, err := host.Open(host.Options{Devices: 2, Capacity: 1 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	cfg := xseg.DefaultConfig()
	for _, kind := range []xseg.AllocatorKind{xseg.AllocatorExpandable, xseg.AllocatorFallback} {
		a, err := xseg.Open(xseg.Options{Driver: d, Allocator: kind, Config: &cfg})
		require.NoError(t, err)
		p, err := a.Alloc(1<<20, 0)
		require.NoError(t, err)
		err = a.EnablePeerAccess(1)
		if kind == xseg.AllocatorExpandable {
			require.NoError(t, err)
			require.Equal(t, []vmm.Access{vmm.AccessReadWrite}, mappedAccess(t, d, a, 1), "device 1 reaches the pages")
			require.NoError(t, a.DisablePeerAccess(1))
			require.Equal(t, []vmm.Access{vmm.AccessNone}, mappedAccess(t, d, a, 1), "and no longer")
		} else {
			require.ErrorIs(t, err, vmm.ErrNotSupported)
		}
		require.NoError(t, a.Free(p))
		require.NoError(t, a.Close())
		_, err = d.DeviceCount()
		require.NoError(t, err, "a driver given to Open stays open")
	}
}

func TestParseKinds(t *testing.T) {
	for s, want := range map[string]xseg.Backend{"": xseg.BackendAuto, "auto": xseg.BackendAuto, "host": xseg.BackendHost, "cuda": xseg.BackendCUDA} {
		got, err := xseg.ParseBackend(s)
		require.NoError(t, err, "%q", s)
		require.Equal(t, want, got)
	}
	_, err := xseg.ParseBackend("tpu")
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.EqualError(t, err, `xseg: unknown backend "tpu" (want auto, host or cuda): invalid argument`)
	_, err = xseg.OpenDriver("HOST", 0)
	require.ErrorContains(t, err, "want auto, host or cuda")

	for s, want := range map[string]xseg.AllocatorKind{"": xseg.AllocatorAuto, "auto": xseg.AllocatorAuto, "expandable": xseg.AllocatorExpandable, "fallback": xseg.AllocatorFallback} {
		got, err := xseg.ParseAllocatorKind(s)
		require.NoError(t, err, "%q", s)
		require.Equal(t, want, got)
	}
	_, err = xseg.ParseAllocatorKind("slab")
	require.EqualError(t, err, `xseg: unknown allocator "slab" (want auto, expandable or fallback): invalid argument`)

	var b xseg.Backend
	require.NoError(t, b.UnmarshalText([]byte("host")))
	require.Equal(t, xseg.BackendHost, b)
	require.ErrorIs(t, b.UnmarshalText([]byte("gpu")), vmm.ErrInvalid)
	require.Equal(t, xseg.BackendHost, b, "a bad name changes nothing")
	var k xseg.AllocatorKind
	require.NoError(t, k.UnmarshalText([]byte("fallback")))
	require.Equal(t, xseg.AllocatorFallback, k)
}
