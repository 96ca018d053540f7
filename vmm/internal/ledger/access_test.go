package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

func TestGrantAccessRulesAndRestore(t *testing.T) {
	l := books(t)
	_, err := l.BeginMap(at(4), 2*G, 3, 0)
	require.NoError(t, err)
	_, err = l.BeginMap(at(0), 2*G, 4, 0)
	require.NoError(t, err)
	rw0, ro1 := vmm.ReadWrite(0), []vmm.AccessDesc{{Device: 1, Flags: vmm.AccessRead}}
	for _, tc := range []struct {
		name   string
		ptr    vmm.DevicePtr
		size   uint64
		access []vmm.AccessDesc
	}{
		{"no descriptors", at(2), 2 * G, nil},
		{"unknown flags", at(2), 2 * G, []vmm.AccessDesc{{Device: 0, Flags: 2}}},
		{"a device twice", at(2), 2 * G, []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessReadWrite}, {Device: 0, Flags: vmm.AccessRead}}},
		{"not mapped", at(6), 2 * G, rw0},
		{"partly mapped", at(2), 6 * G, rw0},
		{"half a mapping", at(2), G, rw0},
	} {
		_, err := l.GrantAccess(tc.ptr, tc.size, tc.access)
		require.ErrorIs(t, err, vmm.ErrInvalid, tc.name)
	}

	// Mappings at granules 0, 2 and 4, with three different accesses
	// before the grant: three runs to restore.
	_, err = l.GrantAccess(at(0), 2*G, rw0)
	require.NoError(t, err)
	_, err = l.GrantAccess(at(4), 2*G, ro1)
	require.NoError(t, err)
	u, err := l.GrantAccess(at(0), 6*G, ro1)
	require.NoError(t, err)
	for _, n := range []uint64{0, 2, 4} {
		require.NoError(t, l.Accessible(at(n), 2*G, 1, vmm.AccessRead), "granule %d", n)
	}
	require.NoError(t, l.Accessible(at(0), 2*G, 0, vmm.AccessReadWrite), "device 0 kept its access")
	l.RestoreAccess(u)
	require.ElementsMatch(t, rw0, mappingAt(t, l, 0).Access)
	require.Empty(t, mappingAt(t, l, 2).Access)
	require.ElementsMatch(t, ro1, mappingAt(t, l, 4).Access)

	// A uniform run: one grant, one restore, whole run back to nothing.
	u, err = l.GrantAccess(at(2), 2*G, rw0)
	require.NoError(t, err)
	require.NoError(t, l.Accessible(at(2), 2*G, 0, vmm.AccessReadWrite))
	l.RestoreAccess(u)
	require.ErrorIs(t, l.Accessible(at(2), 1, 0, vmm.AccessRead), vmm.ErrInvalid, "restored")
}

// TestGrantSameAccessShares checks that granting the access a mapping has,
// or the access granted last, changes no list and allocates nothing.
func TestGrantSameAccessShares(t *testing.T) {
	l := books(t)
	rw0 := vmm.ReadWrite(0)
	_, err := l.GrantAccess(at(2), 2*G, rw0)
	require.NoError(t, err)
	_, err = l.BeginMap(at(4), 2*G, 3, 0)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := l.GrantAccess(at(2), 4*G, rw0); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	a, b := mappingAt(t, l, 2).Access, mappingAt(t, l, 4).Access
	require.Equal(t, rw0, a)
	require.Equal(t, &a[0], &b[0], "one list shared by the run")
}

func mappingAt(t *testing.T, l interface {
	Lookup(vmm.DevicePtr) (ledger.Mapping, bool)
}, n uint64) ledger.Mapping {
	t.Helper()
	m, ok := l.Lookup(at(n))
	require.True(t, ok, "granule %d mapped", n)
	return m
}
