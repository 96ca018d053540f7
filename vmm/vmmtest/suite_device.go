package vmmtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// testDevices checks what the driver reports about itself and every device.
func testDevices(t *testing.T, c Config) {
	e := openAny(t, c)
	require.NotEmpty(t, e.d.Backend(), "Backend")
	v, err := e.d.DriverVersion()
	require.NoError(t, err, "DriverVersion")
	require.GreaterOrEqual(t, v, 0, "DriverVersion")
	n, err := e.d.DeviceCount()
	require.NoError(t, err, "DeviceCount")
	require.Greater(t, n, int(c.Device), "DeviceCount must include the device under test")
	uuids := map[[16]byte]vmm.Device{}
	for dev := vmm.Device(0); int(dev) < n; dev++ {
		info, err := e.d.DeviceInfo(dev)
		require.NoError(t, err, "DeviceInfo(%d)", dev)
		checkInfo(t, dev, info)
		if other, dup := uuids[info.UUID]; dup {
			t.Errorf("devices %d and %d share the UUID %s", other, dev, info.UUIDString())
		}
		uuids[info.UUID] = dev
		free, total, err := e.d.MemInfo(dev)
		require.NoError(t, err, "MemInfo(%d)", dev)
		require.NotZero(t, total, "MemInfo(%d) total", dev)
		require.LessOrEqual(t, free, total, "MemInfo(%d): free > total", dev)
		require.Equal(t, info.TotalMemory, total, "MemInfo(%d) total vs DeviceInfo.TotalMemory", dev)
	}
}

func checkInfo(t *testing.T, dev vmm.Device, info vmm.DeviceInfo) {
	t.Helper()
	require.Equal(t, dev, info.Ordinal, "DeviceInfo(%d).Ordinal", dev)
	require.NotEmpty(t, info.Name, "DeviceInfo(%d).Name", dev)
	require.NotEqual(t, [16]byte{}, info.UUID, "DeviceInfo(%d).UUID is zero", dev)
	require.NotZero(t, info.TotalMemory, "DeviceInfo(%d).TotalMemory", dev)
	if !info.VMM {
		return
	}
	g, r := info.Granularity, info.RecommendedGranularity
	require.True(t, g != 0 && g&(g-1) == 0, "DeviceInfo(%d).Granularity %d is not a power of two", dev, g)
	require.True(t, r >= g && r%g == 0, "DeviceInfo(%d).RecommendedGranularity %d is not a multiple of the granularity %d", dev, r, g)
}

// testDeviceOutOfRange checks that a device ordinal past the last (or
// negative) is ErrInvalid everywhere a device is named.
func testDeviceOutOfRange(t *testing.T, c Config) {
	e := openAny(t, c)
	n, err := e.d.DeviceCount()
	require.NoError(t, err)
	for _, dev := range []vmm.Device{vmm.Device(n), -1} {
		_, err := e.d.DeviceInfo(dev)
		requireIs(t, err, vmm.ErrInvalid, "DeviceInfo(%d)", dev)
		_, _, err = e.d.MemInfo(dev)
		requireIs(t, err, vmm.ErrInvalid, "MemInfo(%d)", dev)
		_, err = e.d.StreamCreate(dev)
		requireIs(t, err, vmm.ErrInvalid, "StreamCreate(%d)", dev)
		_, err = e.d.EventCreate(dev)
		requireIs(t, err, vmm.ErrInvalid, "EventCreate(%d)", dev)
		_, err = e.d.MemAlloc(dev, 4096)
		requireIs(t, err, vmm.ErrInvalid, "MemAlloc(%d, 4096)", dev)
		if e.info.VMM {
			_, err = e.d.Create(dev, e.gran, vmm.HandleNone)
			requireIs(t, err, vmm.ErrInvalid, "Create(%d, %d)", dev, e.gran)
		}
	}
}
