//go:build linux

package ipc

// Tests of the defects of issue 15 (an adversarial audit): each fails on
// the code before its fix.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

const envConns = "XSEG_IPC_CONNS" // connections the hold-conns child opens

func init() {
	allocRoles["truncate"] = childTruncate
	allocRoles["hold-conns"] = childHoldConns
}

// childTruncate fetches the pages and tries to truncate each: it reports
// how the kernel answered.
func childTruncate() error {
	d, opts, err := childDescriptor()
	if err != nil {
		return err
	}
	r, err := Fetch(context.Background(), d, opts)
	if err != nil {
		return err
	}
	defer r.Close()
	var answers []string
	for _, fd := range r.FDs {
		shrink, grow := unix.Ftruncate(fd.Int(), 0), unix.Ftruncate(fd.Int(), 1<<30)
		answers = append(answers, fmt.Sprint(errors.Is(shrink, unix.EPERM) && errors.Is(grow, unix.EPERM)))
	}
	fmt.Printf("via=%s\nrefused=%s\n", r.Via, strings.Join(answers, ","))
	return nil
}

// childHoldConns opens XSEG_IPC_CONNS connections to the endpoint, sends
// nothing on them, says "held" and keeps them until stdin closes.
func childHoldConns() error {
	n, err := strconv.Atoi(os.Getenv(envConns))
	if err != nil {
		return err
	}
	d, _, err := childDescriptor()
	if err != nil {
		return err
	}
	var conns []net.Conn
	for range n {
		c, err := net.Dial("unixpacket", d.Endpoint)
		if err != nil {
			return fmt.Errorf("connection %d: %w", len(conns), err)
		}
		conns = append(conns, c)
	}
	fmt.Println("held")
	_, _ = os.Stdin.Read(make([]byte, 1))
	for _, c := range conns {
		_ = c.Close()
	}
	return nil
}

// TestImporterCannotTruncate (item 1): a child fetches the pages of a
// block and truncates them: the call fails, and the exporter's copy from
// its own block still works (before the fix the child's ftruncate
// succeeded and the parent's copy died of SIGBUS).
func TestImporterCannotTruncate(t *testing.T) {
	d := backendDriver(t, "host")
	a := shareableAlloc(t, d)
	const size = 6 << 20
	ptr, err := a.Alloc(size, 0)
	require.NoError(t, err)
	require.NoError(t, writePattern(d, ptr, size, seedParent))
	e := newExporter(t, ExporterOptions{})
	s, err := e.ShareBlock(d, a, ptr)
	require.NoError(t, err)
	for _, tr := range []string{"socket", "pidfd"} {
		if tr == "pidfd" && ProbePidfdGetfd() != nil {
			continue
		}
		rep := newChild(t, "truncate", nil, descEnv(t, s), envTransports+"="+tr).run(t)
		require.Equal(t, tr, rep["via"])
		require.NotEmpty(t, rep["refused"])
		require.NotContains(t, rep["refused"], "false", "every page refuses ftruncate")
		require.NoError(t, readPattern(d, ptr, size, seedParent), "the exporter's copy works")
	}
	require.NoError(t, s.Close())
	require.NoError(t, a.Free(ptr))
}

// holdConns starts a child that holds n silent connections to s's socket.
func holdConns(t *testing.T, s *Share, n int, uid *uint32) *proc {
	t.Helper()
	p := startChild(t, "hold-conns", uid, descEnv(t, s), envConns+"="+strconv.Itoa(n))
	p.until(t, "held")
	time.Sleep(100 * time.Millisecond) // let the exporter accept them all
	return p
}

// endHold lets the hold-conns child go and waits for it.
func endHold(t *testing.T, p *proc) {
	t.Helper()
	require.NoError(t, p.stdin.Close())
	require.NoError(t, p.c.cmd.Wait(), "child: %s", p.c.errOut.String())
}

// requireQuickFetch fetches s through the socket within a second.
func requireQuickFetch(t *testing.T, s *Share) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	r, err := Fetch(ctx, s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
	require.NoError(t, err)
	require.Less(t, time.Since(start), time.Second, "an authorised fetch waits for no other peer")
	requireSameFiles(t, s, r.FDs)
	require.NoError(t, r.Close())
}

// TestConnectionFloodDoesNotStarve (item 2): 200 silent connections of a
// refused peer, or of another admitted uid, do not delay an authorised
// fetch (before the fix the exporter read each request, up to 10 s,
// before checking the peer, 64 at a time, whoever they came from).
func TestConnectionFloodDoesNotStarve(t *testing.T) {
	t.Run("refused pid", func(t *testing.T) {
		self := int32(os.Getpid())
		onErr, reported := collectErrors()
		e := newExporter(t, ExporterOptions{OnError: onErr, refuse: func(c *unix.Ucred) bool { return c.Pid != self }})
		s := smallShare(t, e, 2)
		p := holdConns(t, s, 200, nil)
		requireQuickFetch(t, s)
		require.Eventually(t, func() bool { return e.Refused() == 200 }, 5*time.Second, time.Millisecond)
		require.LessOrEqual(t, len(reported()), 2, "refusals are reported at most about once a second")
		require.ErrorIs(t, reported()[0], ErrRefused)
		endHold(t, p)
	})
	t.Run("refused uid", func(t *testing.T) {
		requireRoot(t)
		e := newExporter(t, ExporterOptions{OnError: func(error) {}})
		s := smallShare(t, e, 2)
		uid := uint32(nobody)
		p := holdConns(t, s, 200, &uid)
		requireQuickFetch(t, s)
		require.EqualValues(t, 200, e.Refused())
		endHold(t, p)
	})
	t.Run("admitted uid", func(t *testing.T) {
		requireRoot(t)
		e := newExporter(t, ExporterOptions{Policy: Policy{UIDs: []uint32{nobody}}, OnError: func(error) {}})
		s := smallShare(t, e, 2)
		uid := uint32(nobody)
		p := holdConns(t, s, 200, &uid)
		requireQuickFetch(t, s)
		require.Zero(t, e.Refused())
		endHold(t, p)
	})
}

// TestRefusalRevealsNoUIDs (item 2): a refused peer learns only that the
// policy refused it, whether its request reached the exporter or not.
func TestRefusalRevealsNoUIDs(t *testing.T) {
	requireNoFDLeak(t)
	onErr, reported := collectErrors()
	e := newExporter(t, ExporterOptions{Policy: Policy{UIDs: []uint32{4242, 31337}}, OnError: onErr,
		refuse: func(*unix.Ucred) bool { return true }})
	s := smallShare(t, e, 1)
	for i := range 50 {
		_, err := Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
		require.ErrorIs(t, err, ErrRefused, "attempt %d", i)
		require.ErrorContains(t, err, refusalMessage, "attempt %d: the reply, not a broken pipe", i)
		for _, leak := range []string{"uid", "4242", "31337"} {
			require.NotContains(t, err.Error(), leak)
		}
	}
	c, err := net.Dial("unixpacket", e.Endpoint())
	require.NoError(t, err)
	buf := make([]byte, replyHeader+maxMessage)
	n, err := c.Read(buf)
	require.NoError(t, err, "the refusal comes before any request")
	status, _, msg, err := decodeReply(buf[:n])
	require.NoError(t, err)
	require.Equal(t, statusRefused, status)
	require.Equal(t, refusalMessage, msg)
	require.NoError(t, c.Close())
	// The exporter counts a refusal after its reply is on the wire, so the
	// client can see the reply first.
	require.Eventually(t, func() bool { return e.Refused() == 51 }, 5*time.Second, time.Millisecond)
	require.Len(t, reported(), 1, "51 refusals within a second make one report")
}

// otherPages makes a share of n pages with pattern seed in a fresh
// exporter-owned set of memfds.
func patternShare(t *testing.T, e *Exporter, n int, seed byte) *Share {
	t.Helper()
	const ps = 4096
	fds := makePages(t, n, ps)
	m, err := mapPages(fds, ps, 0, ps*uint64(n))
	require.NoError(t, err)
	fillPattern(m.block, seed)
	require.NoError(t, m.unmap())
	s, err := e.ShareFDs(fds, Extent{PageSize: ps, Length: ps * uint64(n)}, nil)
	require.NoError(t, err)
	return s
}

// TestStaleDescriptorAfterFDReuse (item 3): without a socket, a share's fd
// numbers are reused by the next share once it closes; its old
// descriptor is refused instead of mapping the new share's pages.
func TestStaleDescriptorAfterFDReuse(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{NoSocket: true})
	old := patternShare(t, e, 2, seedParent)
	stale, err := old.MarshalBinary()
	require.NoError(t, err)
	oldDesc := old.Descriptor()
	require.NoError(t, old.Close())
	cur := patternShare(t, e, 2, seedChild)
	numbers := map[int]bool{cur.Descriptor().AuthFD: true}
	for _, n := range cur.Descriptor().PageFDs {
		numbers[n] = true
	}
	reused := numbers[oldDesc.AuthFD]
	for _, n := range oldDesc.PageFDs {
		reused = reused || numbers[n]
	}
	require.True(t, reused, "the new share reuses the old one's fd numbers")

	_, err = Fetch(context.Background(), oldDesc, FetchOptions{})
	require.ErrorIs(t, err, ErrNotOffered)
	imp := backendDriver(t, "host")
	_, err = Open(context.Background(), stale, imp, 0, OpenOptions{})
	require.ErrorIs(t, err, ErrNotOffered)
	require.True(t, imp.Usage().Zero(), "nothing mapped: %v", imp.Usage())

	r, err := Fetch(context.Background(), cur.Descriptor(), FetchOptions{})
	require.NoError(t, err, "the live share's descriptor works")
	requireSameFiles(t, cur, r.FDs)
	require.NoError(t, r.Close())
}

// arenaFD finds the host driver's arena memfd among this process's fds.
func arenaFD(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, ent := range ents {
		link, err := os.Readlink("/proc/self/fd/" + ent.Name())
		if err == nil && strings.HasPrefix(link, "/memfd:xseg-host-arena-dev0") {
			n, err := strconv.Atoi(ent.Name())
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no arena memfd open")
	return -1
}

// TestForgedDescriptorRefused (item 3): a descriptor that names another fd
// of the exporter (its arena memfd, holding every unshared page) is
// refused, whether as a page, as the authentication fd or with an
// invented token.
func TestForgedDescriptorRefused(t *testing.T) {
	requirePidfd(t)
	exp := backendDriver(t, "host")
	a := shareableAlloc(t, exp)
	ptr, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	e := newExporter(t, ExporterOptions{NoSocket: true})
	s, err := e.ShareBlock(exp, a, ptr)
	require.NoError(t, err)
	defer func() { require.NoError(t, errors.Join(s.Close(), a.Free(ptr))) }()
	arena := arenaFD(t)
	imp := backendDriver(t, "host")
	for name, forge := range map[string]func(d *handles.Descriptor){
		"arena as page":  func(d *handles.Descriptor) { d.PageFDs[0] = arena },
		"arena as auth":  func(d *handles.Descriptor) { d.AuthFD = arena },
		"page as auth":   func(d *handles.Descriptor) { d.AuthFD = d.PageFDs[0] },
		"invented token": func(d *handles.Descriptor) { d.Token[0] ^= 0x80 },
	} {
		t.Run(name, func(t *testing.T) {
			d := s.Descriptor()
			forge(d)
			_, err := Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportPidfd}})
			require.ErrorIs(t, err, ErrNotOffered)
			b, err := d.MarshalBinary()
			require.NoError(t, err)
			_, err = Open(context.Background(), b, imp, 0, OpenOptions{})
			require.ErrorIs(t, err, ErrNotOffered)
			require.True(t, imp.Usage().Zero(), "nothing mapped: %v", imp.Usage())
		})
	}
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	m, err := Open(context.Background(), b, imp, 0, OpenOptions{})
	require.NoError(t, err, "the true descriptor opens")
	require.Equal(t, TransportPidfd, m.Via())
	require.NoError(t, m.Close())
}

// TestOldDescriptorRefusedByPidfd (item 3): a version-1 descriptor (no
// authentication fd) is not fetched by bare fd numbers; the socket, which
// checks the token, still serves it.
func TestOldDescriptorRefusedByPidfd(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	s := smallShare(t, e, 2)
	d := s.Descriptor()
	d.HasAuth, d.AuthFD = false, 0
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	require.EqualValues(t, handles.VersionNoAuth, b[4])
	_, err = Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportPidfd}})
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.ErrorContains(t, err, "no authentication fd")
	r, err := Fetch(context.Background(), d, FetchOptions{})
	require.NoError(t, err)
	require.Equal(t, TransportSocket, r.Via)
	require.NoError(t, r.Close())
}

// TestPidfdRacingClose (item 3): pidfd fetches racing the close of their
// share and the making of the next, which reuses its fd numbers, either
// fail with ErrNotOffered or get exactly the share's files.
func TestPidfdRacingClose(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{NoSocket: true})
	for range 50 {
		s := smallShare(t, e, 4)
		d := s.Descriptor()
		var want []handles.FileID
		for _, n := range d.PageFDs {
			id, err := handles.FileIDOf(n)
			require.NoError(t, err)
			want = append(want, id)
		}
		var wg sync.WaitGroup
		var bad []string
		var mu sync.Mutex
		for range 4 {
			wg.Go(func() {
				r, err := Fetch(context.Background(), d, FetchOptions{})
				if err != nil {
					if !errors.Is(err, ErrNotOffered) {
						mu.Lock()
						bad = append(bad, err.Error())
						mu.Unlock()
					}
					return
				}
				for i, fd := range r.FDs {
					if id, err := handles.FileIDOf(fd.Int()); err != nil || id != want[i] {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("page %d is another file", i))
						mu.Unlock()
					}
				}
				_ = r.Close()
			})
		}
		require.NoError(t, s.Close())
		next := smallShare(t, e, 4) // reuses the numbers
		wg.Wait()
		require.Empty(t, bad)
		require.NoError(t, next.Close())
	}
}

// reserveSpy records the sizes a driver is asked to reserve.
type reserveSpy struct {
	vmm.Driver
	mu    sync.Mutex
	sizes []uint64
}

func (r *reserveSpy) Reserve(size, align uint64) (vmm.DevicePtr, error) {
	r.mu.Lock()
	r.sizes = append(r.sizes, size)
	r.mu.Unlock()
	return r.Driver.Reserve(size, align)
}

// TestOpenRefusesExtentBeyondDeviceMemory (item 8): a descriptor of 16
// pages of 1 TiB opened on a 1 GiB device is refused before any address
// space is reserved (before the fix the importer reserved 16 TiB).
func TestOpenRefusesExtentBeyondDeviceMemory(t *testing.T) {
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	const tib = 1 << 40
	s, err := e.ShareFDs(makePages(t, 16, 4096), Extent{PageSize: tib, Length: 15*tib + 1}, nil)
	require.NoError(t, err)
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	d, err := host.Open(host.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	spy := &reserveSpy{Driver: d}
	_, err = Open(context.Background(), b, spy, 0, OpenOptions{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "exceeds device 0's 1073741824 bytes of memory")
	require.Empty(t, spy.sizes, "nothing reserved")
	require.True(t, d.Usage().Zero(), "%v", d.Usage())
	require.Zero(t, s.Leases(), "nothing fetched")
	require.NoError(t, s.Close())
}

// TestWholePageBlockSharesNothingElse (item 14): sharing a small block
// exposes its whole page to the importer; a block that is a whole large
// page, at the start of its page, shares exactly itself. OpenOptions.Access
// read-only keeps the importer from writing.
func TestWholePageBlockSharesNothingElse(t *testing.T) {
	requireNoFDLeak(t)
	d := backendDriver(t, "host")
	a := shareableAlloc(t, d)
	e := newExporter(t, ExporterOptions{})
	const large = 20 << 20
	whole, err := a.Alloc(large, 0)
	require.NoError(t, err)
	small, err := a.Alloc(4096, 0)
	require.NoError(t, err)

	s, err := e.ShareBlock(d, a, whole)
	require.NoError(t, err)
	desc := s.Descriptor()
	require.Zero(t, desc.Offset)
	require.EqualValues(t, large, desc.Length)
	require.Equal(t, desc.Length, desc.Bytes(), "the importer can reach the block and nothing else")

	s2, err := e.ShareBlock(d, a, small)
	require.NoError(t, err)
	require.EqualValues(t, 2<<20, s2.Descriptor().Bytes(), "a 4 KiB block exposes its whole 2 MiB page")
	require.NoError(t, s2.Close())

	require.NoError(t, writePattern(d, whole, large, seedParent))
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	imp := backendDriver(t, "host")
	m, err := Open(context.Background(), b, imp, 0, OpenOptions{Access: vmm.AccessRead})
	require.NoError(t, err)
	require.NoError(t, readPattern(imp, m.Ptr(), m.Len(), seedParent))
	require.ErrorIs(t, imp.CopyHtoD(m.Ptr(), []byte{1}), vmm.ErrInvalid, "a read-only importer cannot write")
	require.NoError(t, m.Close())
	require.Eventually(t, func() bool { return s.Leases() == 0 }, 5*time.Second, time.Millisecond)
	require.NoError(t, s.Close())
	require.NoError(t, a.Free(whole))
	require.NoError(t, a.Free(small))
}
