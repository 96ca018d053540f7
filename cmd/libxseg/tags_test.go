//go:build cgo

package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

func tagStats(t *testing.T, l *library, dev int, name string) xseg.TagStats {
	t.Helper()
	b, err := l.tagStatsJSON(dev, name)
	require.NoError(t, err)
	var ts xseg.TagStats
	require.NoError(t, json.Unmarshal(b, &ts))
	return ts
}

func TestLibraryPauseResume(t *testing.T) {
	l := hostLibrary(t, nil)
	// No allocator yet: pausing everything has nothing to do, a named tag
	// does not exist, and the device has no tags.
	require.NoError(t, l.pause(0, nil, true))
	require.NoError(t, l.resume(-1, nil))
	require.ErrorContains(t, l.pause(0, []string{"w"}, true), `tag "w": no such tag on device 0`)
	require.ErrorContains(t, l.resume(-1, []string{"w"}), `tag "w": no such tag on any device`)
	b, err := l.tagsJSON(0)
	require.NoError(t, err)
	require.Equal(t, "[]", string(b))
	_, err = l.tagStatsJSON(0, "w")
	require.ErrorContains(t, err, "device 0 has no tags")

	id, err := l.tag(0, "w")
	require.NoError(t, err)
	require.ErrorIs(t, l.pause(3, nil, false), vmm.ErrInvalid, "a device the host backend does not have")
	require.ErrorIs(t, l.resume(3, nil), vmm.ErrInvalid)
	require.True(t, id.IsTag())
	again, err := l.tag(0, "w")
	require.NoError(t, err)
	require.Equal(t, id, again)
	kv, err := l.tag(0, "kv")
	require.NoError(t, err)
	require.NotEqual(t, id, kv)
	for _, bad := range []string{"", string(make([]byte, 257)), "\xff"} {
		_, err := l.tag(0, bad)
		require.ErrorIs(t, err, vmm.ErrInvalid, "%q", bad)
	}
	_, err = l.tag(-1, "w")
	require.ErrorIs(t, err, vmm.ErrInvalid)

	const n = 5 << 20
	p, err := l.mallocInPool(n, 0, 0, id)
	require.NoError(t, err)
	q, err := l.mallocInPool(n, 0, 0, kv)
	require.NoError(t, err)
	drv := l.driver()
	want := bytes.Repeat([]byte("pause"), n/5)
	require.NoError(t, drv.CopyHtoD(p, want))
	ts := tagStats(t, l, 0, "w")
	require.Equal(t, int64(1), ts.Allocations)
	require.GreaterOrEqual(t, ts.ReservedBytes, uint64(n))
	reserved := stats(t, l, 0).ReservedBytes.All.Current

	require.NoError(t, l.pause(-1, []string{"w"}, true))
	ts = tagStats(t, l, 0, "w")
	require.True(t, ts.Paused && ts.Backup)
	require.Zero(t, ts.ReservedBytes)
	require.Equal(t, uint64(n), ts.BackupBytes)
	require.Equal(t, reserved-int64(ts.PausedBytes), stats(t, l, 0).ReservedBytes.All.Current)
	_, err = l.mallocInPool(4096, 0, 0, id)
	require.ErrorIs(t, err, xseg.ErrPaused)
	require.False(t, tagStats(t, l, 0, "kv").Paused)

	require.NoError(t, l.pause(0, nil, false)) // kv without backup; w stays as it is
	require.True(t, tagStats(t, l, 0, "kv").Paused)
	require.True(t, tagStats(t, l, 0, "w").Backup)

	require.NoError(t, l.resume(0, nil))
	got := make([]byte, n)
	require.NoError(t, drv.CopyDtoH(got, p))
	require.Equal(t, want, got)
	require.Equal(t, reserved, stats(t, l, 0).ReservedBytes.All.Current)
	ts = tagStats(t, l, 0, "w")
	require.Equal(t, int64(1), ts.Remaps)
	require.Equal(t, int64(1), ts.Pauses)

	b, err = l.tagsJSON(0)
	require.NoError(t, err)
	var all []xseg.TagStats
	require.NoError(t, json.Unmarshal(b, &all))
	require.Len(t, all, 2)
	require.Equal(t, "kv", all[0].Name)
	require.Equal(t, "w", all[1].Name)

	require.NoError(t, l.free(p, 0))
	require.NoError(t, l.free(q, 0))
	_, err = l.tagsJSON(-2)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = l.tagsJSON(9)
	require.ErrorContains(t, err, "device 9")
}
