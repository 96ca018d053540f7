//go:build linux

package ipc

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/vmm"
)

// TestStaleAndForgedBlockDescriptors (issue 15, item 3) runs the stale and
// forged descriptor cases on allocator blocks of each backend: on the GPU
// machine (XSEG_REQUIRE_GPU=1) the pages are CUDA allocations exported as
// fds, whose file identity need not tell pages apart, so the descriptor's
// authentication must hold by its fd list and token alone. An exporter
// without a socket makes the pidfd path the only one.
func TestStaleAndForgedBlockDescriptors(t *testing.T) {
	for _, backend := range []string{"host", "cuda"} {
		t.Run(backend, func(t *testing.T) {
			requirePidfd(t)
			d := backendDriver(t, backend)
			cfg := expandable.ClassicConfig()
			cfg.Shareable = true
			a, err := expandable.New(d, 0, cfg, nil)
			require.NoError(t, err)
			var ptrs []vmm.DevicePtr
			defer func() {
				for _, p := range ptrs {
					require.NoError(t, a.Free(p))
				}
				require.NoError(t, a.Close())
			}()
			e := newExporter(t, ExporterOptions{NoSocket: true})
			share := func(size uint64) (*Share, []byte) {
				p, err := a.Alloc(size, 0)
				require.NoError(t, err)
				ptrs = append(ptrs, p)
				s, err := e.ShareBlock(d, a, p)
				require.NoError(t, err)
				b, err := s.MarshalBinary()
				require.NoError(t, err)
				return s, b
			}

			old, stale := share(40 << 20)
			oldDesc := old.Descriptor()
			require.NoError(t, old.Close())
			cur, live := share(40 << 20) // takes the closed share's fd numbers
			_, err = Open(context.Background(), stale, d, 0, OpenOptions{})
			require.ErrorIs(t, err, ErrNotOffered, "a closed share's descriptor")

			// Forged: the live share's token with the old fd numbers, and
			// the live share's fds shuffled.
			forged := *cur.Descriptor()
			forged.PageFDs = append([]int(nil), oldDesc.PageFDs...)
			forged.PageFDs[0], forged.AuthFD = forged.AuthFD, forged.PageFDs[0]
			fb, err := forged.MarshalBinary()
			require.NoError(t, err)
			_, err = Open(context.Background(), fb, d, 0, OpenOptions{})
			require.ErrorIs(t, err, ErrRefused, "a forged descriptor")
			swapped := *cur.Descriptor()
			swapped.PageFDs = append([]int(nil), swapped.PageFDs...)
			swapped.PageFDs[0], swapped.PageFDs[1] = swapped.PageFDs[1], swapped.PageFDs[0]
			sb, err := swapped.MarshalBinary()
			require.NoError(t, err)
			_, err = Open(context.Background(), sb, d, 0, OpenOptions{})
			require.ErrorIs(t, err, ErrRefused, "pages in the wrong order")

			m, err := Open(context.Background(), live, d, 0, OpenOptions{})
			require.NoError(t, err, "the live descriptor opens")
			require.Equal(t, TransportPidfd, m.Via())
			require.NoError(t, m.Close())
			require.NoError(t, cur.Close())
			_, err = Open(context.Background(), live, d, 0, OpenOptions{})
			require.ErrorIs(t, err, ErrNotOffered, "after Close the descriptor is stale")
		})
	}
}
