package expandable

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// matrixConfig is the default configuration without OOM backoff sleeps.
func matrixConfig() Config {
	cfg := ClassicConfig()
	cfg.OOMMaxRetries = 0
	return cfg
}

// allocScenario makes an allocator, runs setup on it, and returns the
// subject whose Act is act and whose Again is act's allocations once more
// followed by EmptyCache.
func allocScenario(name string, cfg Config, setup func(a *Allocator) error, act func(a *Allocator) error, again func(a *Allocator) error) vmmtest.Scenario {
	return vmmtest.Scenario{Name: name, Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
		a, err := New(d, 0, cfg, nil)
		if err != nil {
			return vmmtest.Subject{}, err
		}
		s := vmmtest.Subject{Act: func() error { return act(a) }, Close: a.Close}
		if again != nil {
			s.Again = func() error { return errors.Join(again(a), a.EmptyCache()) }
		}
		if err := setup(a); err != nil {
			return vmmtest.Subject{}, errors.Join(err, a.Close())
		}
		return s, nil
	}}
}

// allocFree allocates size bytes and frees them.
func allocFree(a *Allocator, size uint64) error {
	p, err := a.Alloc(size, 0)
	if err != nil {
		return err
	}
	return a.Free(p)
}

// allocFreeReusable allocates size bytes through AllocReusable, which
// must answer no for a block of a page or more, and frees them.
func allocFreeReusable(a *Allocator, size uint64) error {
	p, ok, err := a.AllocReusable(size, 0)
	if err != nil {
		return err
	}
	if ok {
		return errors.Join(fmt.Errorf("AllocReusable(%d) answered yes for a block of a page or more", size), a.Free(p))
	}
	return a.Free(p)
}

// freeFirstOf is a setup that allocates sizes into *held and frees the
// first: a freed block with a live one after it.
func freeFirstOf(held *[]vmm.DevicePtr, sizes ...uint64) func(a *Allocator) error {
	return func(a *Allocator) error {
		var err error
		if *held, err = alloc(a, sizes...); err != nil {
			return err
		}
		return a.Free((*held)[0])
	}
}

func alloc(a *Allocator, sizes ...uint64) ([]vmm.DevicePtr, error) {
	var ps []vmm.DevicePtr
	for _, s := range sizes {
		p, err := a.Alloc(s, 0)
		if err != nil {
			return ps, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// TestFaultMatrix fails every driver operation of the allocator's and the
// buffer's paths, alone and with the operation that undoes it; after each
// case the object still works, Close reaches nil, and nothing is held.
func TestFaultMatrix(t *testing.T) {
	none := func(*Allocator) error { return nil }
	threshold := matrixConfig()
	threshold.ReleaseThreshold = 1 << 20
	threshold.PageCacheBytes = 20 * mib
	samePages := matrixConfig() // both pools on 2 MiB pages: a large growth takes the small pool's free pages
	samePages.LargePageSize = 2 * mib
	recycle := recycleConfig(true) // a growth unmaps exactly the free pages it lacks, past the (empty) cache
	recycle.OOMMaxRetries = 0
	chunks := chunkConfig(8 * mib) // chunks of 4 pages: a growth of 25 pages makes 6 and a page of its own
	chunksThreshold := chunks
	chunksThreshold.ReleaseThreshold = 1 << 20
	chunksRecycle := recycle
	chunksRecycle.ChunkBytes = 8 * mib
	steady := SteadyConfig() // nothing stolen: a growth makes pages; only the OOM policy unmaps
	steady.OOMMaxRetries = 0
	var held []vmm.DevicePtr
	scenarios := []vmmtest.Scenario{
		allocScenario("steady-grow", steady, freeFirstOf(&held, 40*mib, 2*mib),
			func(a *Allocator) error { _, err := a.Alloc(60*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 60*mib) }),
		// Two free blocks of 150 MiB mapped, 4 live, 220 asked of 512:
		// the growth runs out, the OOM policy unmaps the free pages (each
		// unmap and release failing in turn) and the growth is tried again.
		allocScenario("steady-oom-release", steady, freeHalves,
			func(a *Allocator) error { _, err := a.Alloc(220*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 220*mib) }),
		allocScenario("chunks-alloc", chunks, none,
			func(a *Allocator) error { _, err := a.Alloc(50*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 50*mib) }),
		allocScenario("chunks-release-threshold", chunksThreshold,
			func(a *Allocator) error { var err error; held, err = alloc(a, 30*mib, 4*mib, 20*mib); return err },
			func(a *Allocator) error { return a.Free(held[0]) },
			func(a *Allocator) error { return allocFree(a, 30*mib) }),
		allocScenario("chunks-recycle", chunksRecycle, freeFirstOf(&held, 40*mib, 2*mib),
			func(a *Allocator) error { _, err := a.Alloc(60*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 60*mib) }),
		// A block carved from a free chunk that would end inside it: the
		// sync, the chunk's unmap and release, and the growth into the
		// hole each failed in turn.
		allocScenario("chunks-split", chunks,
			func(a *Allocator) error {
				var err error
				if held, err = alloc(a, 64*mib); err != nil {
					return err
				}
				return a.Free(held[0])
			},
			func(a *Allocator) error { _, err := a.Alloc(30*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 30*mib) }),
		allocScenario("chunks-empty-cache", chunks,
			func(a *Allocator) error {
				var err error
				if held, err = alloc(a, 30*mib, 3*mib, 20*mib); err != nil {
					return err
				}
				return errors.Join(a.Free(held[0]), a.Free(held[1]))
			},
			func(a *Allocator) error { return a.EmptyCache() },
			func(a *Allocator) error { return allocFree(a, 30*mib) }),
		allocScenario("chunks-close", chunks,
			func(a *Allocator) error {
				var err error
				if held, err = alloc(a, 30*mib, 1*mib, 20*mib, 3*mib); err != nil {
					return err
				}
				return a.Free(held[2])
			},
			func(a *Allocator) error { return a.Close() }, nil),
		allocScenario("alloc", matrixConfig(), none,
			func(a *Allocator) error { _, err := a.Alloc(50*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 50*mib) }),
		// AllocReusable (libxseg's plain path) grows under the lock it
		// answers with: its growth fails as Alloc's does.
		allocScenario("alloc-reusable", matrixConfig(), none,
			func(a *Allocator) error { _, _, err := a.AllocReusable(50*mib, 0); return err },
			func(a *Allocator) error { return allocFreeReusable(a, 50*mib) }),
		allocScenario("alloc-reusable-recycle", recycle, freeFirstOf(&held, 40*mib, 2*mib),
			func(a *Allocator) error { _, _, err := a.AllocReusable(60*mib, 0); return err },
			func(a *Allocator) error { return allocFreeReusable(a, 60*mib) }),
		allocScenario("grow", matrixConfig(),
			func(a *Allocator) error { _, err := a.Alloc(10*mib, 0); return err },
			func(a *Allocator) error { _, err := a.Alloc(50*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 50*mib) }),
		allocScenario("release-threshold", threshold,
			func(a *Allocator) error { var err error; held, err = alloc(a, 60*mib, 20*mib); return err },
			func(a *Allocator) error { return a.Free(held[0]) },
			func(a *Allocator) error { return allocFree(a, 60*mib) }),
		allocScenario("steal", matrixConfig(), freeFirstOf(&held, 40*mib, 20*mib),
			func(a *Allocator) error { _, err := a.Alloc(100*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 100*mib) }),
		allocScenario("steal-across-pools", samePages,
			func(a *Allocator) error {
				var err error
				if held, err = alloc(a, 512<<10, 512<<10, 512<<10, 512<<10); err != nil {
					return err
				}
				return errors.Join(a.Free(held[0]), a.Free(held[1]), a.Free(held[2]), a.Free(held[3]))
			},
			func(a *Allocator) error { _, err := a.Alloc(4*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 4*mib) }),
		allocScenario("recycle", recycle, freeFirstOf(&held, 40*mib, 2*mib),
			func(a *Allocator) error { _, err := a.Alloc(60*mib, 0); return err },
			func(a *Allocator) error { return allocFree(a, 60*mib) }),
		recycleAcrossStreams(recycle),
		packFaultScenario(&held),
		packChainFaultScenario(&held, false),
		packChainFaultScenario(&held, true),
		// Config.SizeClasses: a growth of the [4, 8) pages class takes
		// the free pages of the [16, 32) class (retired on the same
		// stream; each map, access grant and retired unmap fails in
		// turn); the class's range is reserved on first use.
		allocScenario("size-classes-recycle", classesConfig(), freeFirstOf(&held, 40*mib, 2*mib),
			func(a *Allocator) error { _, err := alloc(a, 8*mib, 8*mib); return err },
			func(a *Allocator) error { return allocFree(a, 12*mib) }),
		allocScenario("size-classes-empty-cache", classesConfig(),
			func(a *Allocator) error {
				var err error
				if held, err = alloc(a, 40*mib, 1*mib, 8*mib, 3*mib); err != nil {
					return err
				}
				return errors.Join(a.Free(held[0]), a.Free(held[2]))
			},
			func(a *Allocator) error { return a.EmptyCache() },
			func(a *Allocator) error { return allocFree(a, 40*mib) }),
		allocScenario("empty-cache", matrixConfig(),
			func(a *Allocator) error {
				var err error
				if held, err = alloc(a, 60*mib, 1*mib, 20*mib); err != nil {
					return err
				}
				return errors.Join(a.Free(held[0]), a.Free(held[1]))
			},
			func(a *Allocator) error { return a.EmptyCache() },
			func(a *Allocator) error { return allocFree(a, 60*mib) }),
		allocScenario("close", matrixConfig(),
			func(a *Allocator) error {
				var err error
				if held, err = alloc(a, 60*mib, 1*mib, 20*mib, 3*mib); err != nil {
					return err
				}
				return a.Free(held[2])
			},
			func(a *Allocator) error { return a.Close() }, nil),
		bufferScenario("buffer-grow", BufferOptions{Shareable: true},
			func(b *Buffer) error { return b.Grow(2 * mib) },
			func(b *Buffer) error { return b.Grow(6 * mib) },
			func(b *Buffer) error { return b.Grow(6 * mib) }),
		bufferScenario("buffer-shrink", BufferOptions{},
			func(b *Buffer) error { return b.Grow(8 * mib) },
			func(b *Buffer) error { return b.Shrink(6 * mib) },
			func(b *Buffer) error { return b.Shrink(0) }),
		bufferScenario("buffer-close", BufferOptions{},
			func(b *Buffer) error { return b.Grow(6 * mib) },
			func(b *Buffer) error { return b.Close() }, nil),
	}
	open := func() (vmm.Driver, error) { return hostOpen(512 * mib) }
	n := vmmtest.RunMatrix(t, open, scenarios)
	require.Greater(t, n, 100)
	if !t.Failed() {
		t.Logf("fault matrix: %d cases, 0 leaks", n)
	}
}

func bufferScenario(name string, opts BufferOptions, setup, act, again func(b *Buffer) error) vmmtest.Scenario {
	return vmmtest.Scenario{Name: name, Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
		b, err := NewBuffer(d, 0, 64*mib, opts)
		if err != nil {
			return vmmtest.Subject{}, err
		}
		if err := setup(b); err != nil {
			return vmmtest.Subject{}, errors.Join(err, b.Close())
		}
		s := vmmtest.Subject{Act: func() error { return act(b) }, Close: b.Close}
		if again != nil {
			s.Again = func() error { return again(b) }
		}
		return s, nil
	}}
}

// recycleAcrossStreams: a growth on the default stream takes the free pages
// of a side stream's range, after waiting for that stream (the wait, each
// unmap, map and access grant, and their undo, fail in turn).
func recycleAcrossStreams(cfg Config) vmmtest.Scenario {
	return vmmtest.Scenario{Name: "recycle-across-streams", Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
		s, err := d.StreamCreate(0)
		if err != nil {
			return vmmtest.Subject{}, err
		}
		a, err := New(d, 0, cfg, nil)
		if err != nil {
			return vmmtest.Subject{}, errors.Join(err, d.StreamDestroy(s))
		}
		destroyed := false
		closeAll := func() error {
			if err := a.Close(); err != nil {
				return err
			}
			if !destroyed {
				if err := d.StreamDestroy(s); err != nil {
					return err
				}
				destroyed = true
			}
			return nil
		}
		side, err := a.Alloc(40*mib, s)
		if err == nil {
			err = a.Free(side)
		}
		if err != nil {
			return vmmtest.Subject{}, errors.Join(err, closeAll())
		}
		return vmmtest.Subject{
			Act:   func() error { _, err := a.Alloc(40*mib, 0); return err },
			Again: func() error { return errors.Join(allocFree(a, 40*mib), a.EmptyCache()) },
			Close: closeAll,
		}, nil
	}}
}
