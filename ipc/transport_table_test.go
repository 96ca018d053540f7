package ipc

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// TestTransportTable: every transport has a row with a name and a fetch,
// each descriptor kind has an automatic order (pidfd before socket for
// page fds), and a transport outside the table is refused, not tried.
func TestTransportTable(t *testing.T) {
	names := map[string]bool{}
	for tr := TransportPidfd; tr <= TransportCUDAIPC; tr++ {
		ts := tr.spec()
		require.NotNil(t, ts, "%d has a row", tr)
		require.NotEmpty(t, ts.name)
		require.NotNil(t, ts.fetch, "%s fetches", ts.name)
		require.False(t, names[ts.name], "%s named twice", ts.name)
		names[ts.name] = true
		require.Equal(t, ts.name, tr.String())
	}
	require.Equal(t, len(transports)-1, len(names), "no row without a constant")
	require.Equal(t, []Transport{TransportPidfd, TransportSocket}, autoTransports(handles.KindPosixFD))
	require.Equal(t, []Transport{TransportFabric}, autoTransports(handles.KindFabric))
	require.Equal(t, []Transport{TransportCUDAIPC}, autoTransports(handles.KindCUDAIPC))
	require.Empty(t, autoTransports(handles.Kind(99)))

	require.Nil(t, Transport(0).spec())
	require.Nil(t, Transport(200).spec())
	require.Equal(t, "Transport(200)", Transport(200).String())
	_, err := fetchVia(context.Background(), Transport(200), &handles.Descriptor{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
}
