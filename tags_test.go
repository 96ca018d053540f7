package xseg_test

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// Pause the weights of a model with a backup and its KV cache without, so
// that another program can use the device meanwhile; resume both at the
// same addresses.
func ExampleDeviceAllocator_Pause() {
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Backend: "host", Config: &cfg})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	weights, err := a.Tagged("weights")
	if err != nil {
		log.Fatal(err)
	}
	kv, err := a.Tagged("kv_cache")
	if err != nil {
		log.Fatal(err)
	}
	w, err := weights.Alloc(30<<20, 0)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := kv.Alloc(50<<20, 0); err != nil {
		log.Fatal(err)
	}
	if err := a.Driver().Memset(w, 7, 30<<20); err != nil { // "load" the weights
		log.Fatal(err)
	}
	fmt.Println("reserved:", a.Stats().ReservedBytes.All.Current>>20, "MiB")

	if err := weights.Pause(true); err != nil {
		log.Fatal(err)
	}
	if err := kv.Pause(false); err != nil {
		log.Fatal(err)
	}
	fmt.Println("reserved while paused:", a.Stats().ReservedBytes.All.Current>>20, "MiB")
	_, err = kv.Alloc(1<<20, 0)
	fmt.Println("allocating in a paused tag:", errors.Is(err, xseg.ErrPaused))

	if err := a.Resume(); err != nil { // every paused tag
		log.Fatal(err)
	}
	b := make([]byte, 1)
	if err := a.Driver().CopyDtoH(b, w.Add(12345)); err != nil { // same address
		log.Fatal(err)
	}
	st, _ := weights.Stats()
	fmt.Println("weights after resume:", b[0], "remaps:", st.Remaps)
	// Output:
	// reserved: 80 MiB
	// reserved while paused: 0 MiB
	// allocating in a paused tag: true
	// weights after resume: 7 remaps: 1
}

// TestTaggedHandle: a Tagged handle allocates in its tag, pauses and
// resumes it, and reports its statistics; the fallback allocator has tags
// but no pause.
func TestTaggedHandle(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	for _, kind := range []xseg.AllocatorKind{xseg.AllocatorExpandable, xseg.AllocatorFallback} {
		t.Run(string(kind), func(t *testing.T) {
			cfg := xseg.DefaultConfig()
			a, err := xseg.Open(xseg.Options{Driver: d, Allocator: kind, Config: &cfg})
			require.NoError(t, err)
			defer func() { require.NoError(t, a.Close()) }()
			tg, err := a.Tagged("weights")
			require.NoError(t, err)
			require.Equal(t, "weights", tg.Name())
			id, err := a.Tag("weights")
			require.NoError(t, err)
			require.Equal(t, id, tg.ID())
			p, err := tg.Alloc(3<<20, 0)
			require.NoError(t, err)
			ptrs, err := a.PoolAllocations(id)
			require.NoError(t, err)
			require.Equal(t, []vmm.DevicePtr{p}, ptrs, "the block is the tag's")
			want := bytes.Repeat([]byte{0xa5}, 3<<20)
			require.NoError(t, d.CopyHtoD(p, want))
			err = tg.Pause(true)
			if kind == xseg.AllocatorFallback {
				require.ErrorIs(t, err, vmm.ErrNotSupported)
				require.NoError(t, tg.Free(p))
				return
			}
			require.NoError(t, err)
			st, err := tg.Stats()
			require.NoError(t, err)
			require.True(t, st.Paused)
			_, err = tg.Alloc(1, 0)
			require.ErrorIs(t, err, xseg.ErrPaused)
			require.NoError(t, tg.Resume())
			got := make([]byte, len(want))
			require.NoError(t, d.CopyDtoH(got, p))
			require.Equal(t, want, got)
			require.Equal(t, []string{"weights"}, a.Tags())
			require.NoError(t, tg.Free(p))
		})
	}
}
