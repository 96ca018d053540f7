//go:build linux

package handles

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

func newClaim(t *testing.T) *FD {
	t.Helper()
	c, err := NewClaim()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestClaimOneWinner: of many racing claimants, through dups of the file
// as importers hold them, exactly one wins, and every one of them (and a
// late one) reads that same winner.
func TestClaimOneWinner(t *testing.T) {
	for round := range 20 {
		c := newClaim(t)
		const n = 16
		got := make([]Claimant, n)
		var wg sync.WaitGroup
		for i := range n {
			dup, err := c.Dup()
			require.NoError(t, err)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer dup.Close()
				nonce, err := NewNonce()
				if err == nil {
					got[i], err = ClaimFor(dup, Claimant{PID: 1000 + i, Nonce: nonce})
				}
				if err != nil {
					t.Errorf("round %d claimant %d: %v", round, i, err)
				}
			}()
		}
		wg.Wait()
		winners := 0
		for i := range n {
			require.Equal(t, got[0], got[i], "round %d: every claimant reads one winner", round)
			if got[i].PID == 1000+i {
				winners++
			}
		}
		require.Equal(t, 1, winners, "round %d", round)
		late, err := ClaimFor(c, Claimant{PID: 77, Nonce: 5})
		require.NotZero(t, got[0].Nonce>>63, "an importer's nonce has its top bit set")
		require.NoError(t, err)
		require.Equal(t, got[0], late, "a late claimant loses to the first")
		_, err = unix.Pwrite(c.Int(), make([]byte, claimSize), 0)
		require.ErrorIs(t, err, unix.EPERM, "a won claim cannot be rewritten")
	}
}

// TestClaimRejects: a file that is not a claim memfd, one sealed by
// someone who did not claim, one claimed with zeroes, and bad claimants
// are errors wrapping ErrInvalid.
func TestClaimRejects(t *testing.T) {
	me := Claimant{PID: unix.Getpid(), Nonce: 9}
	raw, err := unix.MemfdCreate("plain", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	plain, err := NewFD(raw)
	require.NoError(t, err)
	defer plain.Close()
	_, err = ClaimFor(plain, me)
	require.ErrorIs(t, err, vmm.ErrInvalid, "a memfd without the claim's size seals")

	sealedOnly := newClaim(t)
	_, err = unix.FcntlInt(uintptr(sealedOnly.Int()), unix.F_ADD_SEALS, unix.F_SEAL_SEAL)
	require.NoError(t, err)
	_, err = ClaimFor(sealedOnly, me)
	require.ErrorIs(t, err, vmm.ErrInvalid, "sealed against seals but still writable")

	zeroes := newClaim(t)
	_, err = unix.FcntlInt(uintptr(zeroes.Int()), unix.F_ADD_SEALS, claimedSeals)
	require.NoError(t, err)
	_, err = ClaimFor(zeroes, me)
	require.ErrorIs(t, err, vmm.ErrInvalid, "sealed with nobody in it")

	c := newClaim(t)
	for _, bad := range []Claimant{{PID: 0, Nonce: 1}, {PID: -1, Nonce: 1}, {PID: MaxPID + 1, Nonce: 1}, {PID: 5, Nonce: 0}} {
		_, err = ClaimFor(c, bad)
		require.ErrorIs(t, err, vmm.ErrInvalid, "%+v", bad)
	}
	_, err = ClaimFor(nil, me)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	// The bad claimants left the claim unclaimed.
	w, err := ClaimFor(c, me)
	require.NoError(t, err)
	require.Equal(t, me, w)
}

// TestAuthWithClaim: a version-2 auth memfd vouches for the claim memfd
// too; a descriptor of other pages still fails.
func TestAuthWithClaim(t *testing.T) {
	pages := authPages(t, 2)
	c := newClaim(t)
	tok, err := NewToken()
	require.NoError(t, err)
	auth, err := NewAuth(tok, pages, c)
	require.NoError(t, err)
	defer auth.Close()
	d := validAuthed()
	d.ExporterPID, d.Token, d.AuthFD = unix.Getpid(), tok, auth.Int()
	d.PageFDs, d.PageCount = []int{pages[0].Int(), pages[1].Int()}, 2
	a, err := d.CheckAuth(auth.Int())
	require.NoError(t, err)
	require.Len(t, a.Pages, 2)
	require.NotNil(t, a.Claim)
	id, err := FileIDOf(c.Int())
	require.NoError(t, err)
	require.Equal(t, FileRef{FD: c.Int(), ID: id}, *a.Claim)

	three := *d
	three.PageFDs, three.PageCount = append(append([]int(nil), d.PageFDs...), c.Int()), 3
	_, err = three.CheckAuth(auth.Int())
	require.ErrorIs(t, err, vmm.ErrInvalid, "a version-2 auth of 2 pages is no auth of 3")
	one := *d
	one.PageFDs, one.PageCount = d.PageFDs[:1], 1
	_, err = one.CheckAuth(auth.Int())
	require.ErrorIs(t, err, vmm.ErrInvalid)

	closed, err := NewClaim()
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	_, err = NewAuth(tok, pages, closed)
	require.ErrorIs(t, err, vmm.ErrInvalid, "a closed claim fd")
}
