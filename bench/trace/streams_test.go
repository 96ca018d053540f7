package trace

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

func openHost(t *testing.T) vmm.Driver {
	t.Helper()
	d, err := host.Open(host.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

const threeStreams = "a 1 10 7\na 2 10 0\na 3 10 3\n"

func TestOpenStreams(t *testing.T) {
	d := openHost(t)
	tr := parse(t, threeStreams)
	require.Equal(t, []uint32{0, 3, 7}, tr.Streams)
	streams, destroy, err := OpenStreams(d, 0, tr)
	require.NoError(t, err)
	require.Len(t, streams, 3)
	require.Equal(t, vmm.Stream(0), streams[0], "trace stream 0 is the default stream")
	require.NotZero(t, streams[1])
	require.NotZero(t, streams[2])
	require.NotEqual(t, streams[1], streams[2])
	require.Equal(t, 2, d.Usage().Streams)

	f := newFake()
	_, err = Replay(tr, f, Options{Streams: streams})
	require.NoError(t, err)
	require.Equal(t, map[vmm.Stream]int{streams[2]: 1, 0: 1, streams[1]: 1}, f.streams)

	require.NoError(t, destroy())
	require.Zero(t, d.Usage().Streams)
	require.NoError(t, destroy(), "a second call destroys nothing more")
}

func TestOpenStreamsUnwinds(t *testing.T) {
	d := openHost(t)
	faulty := vmmtest.NewFaulty(d)
	faulty.FailNth(vmmtest.OpStreamCreate, 2, nil)
	_, _, err := OpenStreams(faulty, 0, parse(t, threeStreams))
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.ErrorContains(t, err, "creating stream for trace stream 7")
	require.Zero(t, d.Usage().Streams, "the stream made before the failure is destroyed")
}
