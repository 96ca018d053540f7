//go:build linux

package handles

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

// TestAuthLayout pins the version-2 wire form: version 2, the auth fd
// after the handles; and a version-2 descriptor fails to parse in pieces.
func TestAuthLayout(t *testing.T) {
	d := validAuthed()
	b := requireTruncationsRejected(t, d)
	le := binary.LittleEndian
	require.EqualValues(t, 2, le.Uint16(b[4:]))
	require.EqualValues(t, 6, le.Uint32(b[len(b)-4:]))
	n := int(le.Uint16(b[72:]))
	require.Len(t, b, 74+n+4+3*4+4)
}

func TestAuthRejects(t *testing.T) {
	for name, mutate := range map[string]func(d *Descriptor){
		"auth without fds":    func(d *Descriptor) { d.PageFDs = nil },
		"auth fd negative":    func(d *Descriptor) { d.AuthFD = -1 },
		"auth fd without has": func(d *Descriptor) { d.HasAuth = false },
		"auth on fabric":      func(d *Descriptor) { *d = *validFabric(); d.HasAuth, d.AuthFD = true, 3 },
	} {
		t.Run(name, func(t *testing.T) {
			d := validAuthed()
			mutate(d)
			_, err := d.MarshalBinary()
			require.ErrorIs(t, err, vmm.ErrInvalid)
		})
	}
}

// authPages makes n sealed-or-not memfds for CheckAuth to name.
func authPages(t *testing.T, n int) []*FD {
	t.Helper()
	var fds []*FD
	for range n {
		raw, err := unix.MemfdCreate("auth-page", unix.MFD_CLOEXEC)
		require.NoError(t, err)
		fd, err := NewFD(raw)
		require.NoError(t, err)
		t.Cleanup(func() { _ = fd.Close() })
		fds = append(fds, fd)
	}
	return fds
}

// TestCheckAuth: the auth memfd of a share vouches for its token, pid and
// fd numbers and lists its pages' identities; it cannot be changed, and
// any other descriptor is refused with ErrInvalid.
func TestCheckAuth(t *testing.T) {
	pages := authPages(t, 3)
	tok, err := NewToken()
	require.NoError(t, err)
	auth, err := NewAuth(tok, pages, nil)
	require.NoError(t, err)
	defer auth.Close()
	d := validAuthed()
	d.ExporterPID, d.Token, d.AuthFD = unix.Getpid(), tok, auth.Int()
	d.PageFDs = []int{pages[0].Int(), pages[1].Int(), pages[2].Int()}
	a, err := d.CheckAuth(auth.Int())
	require.NoError(t, err)
	require.Nil(t, a.Claim)
	ids := a.Pages
	for i, p := range pages {
		id, err := FileIDOf(p.Int())
		require.NoError(t, err)
		require.Equal(t, id, ids[i], "page %d", i)
	}

	_, err = unix.Pwrite(auth.Int(), []byte("x"), 0)
	require.ErrorIs(t, err, unix.EPERM, "nobody can rewrite an auth memfd")
	require.ErrorIs(t, unix.Ftruncate(auth.Int(), 0), unix.EPERM)

	for name, mutate := range map[string]func(d *Descriptor){
		"other token":   func(d *Descriptor) { d.Token[3] ^= 1 },
		"other pid":     func(d *Descriptor) { d.ExporterPID++ },
		"other fd":      func(d *Descriptor) { d.PageFDs[1] = d.AuthFD },
		"swapped fds":   func(d *Descriptor) { d.PageFDs[0], d.PageFDs[1] = d.PageFDs[1], d.PageFDs[0] },
		"fewer fds":     func(d *Descriptor) { d.PageFDs = d.PageFDs[:2]; d.PageCount = 2 },
		"not auth file": func(d *Descriptor) { d.AuthFD = pages[0].Int() },
	} {
		t.Run(name, func(t *testing.T) {
			c := *d
			c.PageFDs = append([]int(nil), d.PageFDs...)
			mutate(&c)
			_, err := c.CheckAuth(c.AuthFD)
			require.ErrorIs(t, err, vmm.ErrInvalid)
			require.ErrorContains(t, err, "authenticating the descriptor")
		})
	}
}
