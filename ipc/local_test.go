//go:build linux

package ipc

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// smallShare shares n 4 KiB memfd pages, the whole extent.
func smallShare(t *testing.T, e *Exporter, n int) *Share {
	t.Helper()
	const ps = 4096
	s, err := e.ShareFDs(makePages(t, n, ps), Extent{PageSize: ps, Length: ps * uint64(n)}, nil)
	require.NoError(t, err)
	return s
}

// requireSameFiles checks that got names the same open files as the share.
func requireSameFiles(t *testing.T, s *Share, got []*handles.FD) {
	t.Helper()
	want := s.Descriptor().PageFDs
	require.Len(t, got, len(want))
	for i := range got {
		var a, b unix.Stat_t
		require.NoError(t, unix.Fstat(want[i], &a))
		require.NoError(t, unix.Fstat(got[i].Int(), &b))
		require.Equal(t, a.Ino, b.Ino, "page %d", i)
	}
}

func collectErrors() (func(error), func() []error) {
	var mu sync.Mutex
	var errs []error
	return func(err error) {
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err)
		}, func() []error {
			mu.Lock()
			defer mu.Unlock()
			return append([]error(nil), errs...)
		}
}

func TestSocketBatchesManyPages(t *testing.T) {
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	s := smallShare(t, e, 300) // 253 + 47
	r, err := Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
	require.NoError(t, err)
	requireSameFiles(t, s, r.FDs)
	require.NoError(t, r.Close())
}

func TestPidfdFromSelf(t *testing.T) {
	requirePidfd(t)
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{NoSocket: true})
	s := smallShare(t, e, 3)
	r, err := Fetch(context.Background(), s.Descriptor(), FetchOptions{})
	require.NoError(t, err)
	require.Equal(t, TransportPidfd, r.Via)
	requireSameFiles(t, s, r.FDs)
	require.NoError(t, r.Close())
}

func TestWrongTokenRefused(t *testing.T) {
	requireNoFDLeak(t)
	onErr, reported := collectErrors()
	e := newExporter(t, ExporterOptions{OnError: onErr})
	s := smallShare(t, e, 2)
	d := s.Descriptor()
	d.Token[0] ^= 1
	_, err := Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportSocket}})
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "no live share has this token")
	// The exporter reports after its reply is on the wire, so the client
	// can return first.
	require.Eventually(t, func() bool { return len(reported()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.ErrorIs(t, reported()[0], ErrRefused)

	r, err := Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
	require.NoError(t, err, "the right token still works")
	require.NoError(t, r.Close())

	require.NoError(t, s.Close())
	_, err = Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
	require.ErrorIs(t, err, ErrRefused, "a closed share is not served")
}

func TestMalformedRequestReported(t *testing.T) {
	requireNoFDLeak(t)
	onErr, reported := collectErrors()
	e := newExporter(t, ExporterOptions{OnError: onErr})
	s := smallShare(t, e, 1)
	c, err := net.Dial("unixpacket", e.Endpoint())
	require.NoError(t, err)
	_, err = c.Write([]byte("hello"))
	require.NoError(t, err)
	buf := make([]byte, 1024)
	n, err := c.Read(buf)
	require.NoError(t, err)
	status, _, msg, err := decodeReply(buf[:n])
	require.NoError(t, err)
	require.Equal(t, statusBadRequest, status)
	require.Equal(t, "malformed request", msg)
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return len(reported()) == 1 }, 5*time.Second, 10*time.Millisecond)

	r, err := Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
	require.NoError(t, err)
	require.NoError(t, r.Close())
}

func TestCloseEndsStalledExchanges(t *testing.T) {
	requireNoFDLeak(t)
	e, err := NewExporter(ExporterOptions{Timeout: time.Minute})
	require.NoError(t, err)
	s := smallShare(t, e, 2)
	d := s.Descriptor()
	var conns []net.Conn
	for i := 0; i < 3; i++ { // connect and never send
		c, err := net.Dial("unixpacket", e.Endpoint())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	require.NoError(t, e.Close())
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, e.Close(), "Close is idempotent")
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	for _, fd := range d.PageFDs {
		_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		require.ErrorIs(t, err, unix.EBADF, "Close closes the shares' fds")
	}
	_, err = Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportSocket}})
	require.Error(t, err)
	_, err = e.ShareFDs(makePages(t, 1, 4096), Extent{PageSize: 4096, Length: 4096}, nil)
	require.ErrorIs(t, err, vmm.ErrClosed)
}

func TestAllTransportsFailJoined(t *testing.T) {
	d := &handles.Descriptor{
		Kind: handles.KindPosixFD, ExporterPID: os.Getpid(), PageSize: 4096, PageCount: 1,
		Length: 4096, Token: handles.Token{1},
	}
	_, err := Fetch(context.Background(), d, FetchOptions{})
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.ErrorContains(t, err, "pidfd: descriptor carries no fd numbers")
	require.ErrorContains(t, err, "socket: exporter serves no socket")

	d.PageFDs = []int{1 << 20}
	_, err = Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportPidfd}})
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.ErrorContains(t, err, "no authentication fd", "bare fd numbers are not trusted")

	d.Endpoint = "@xseg-nobody-listens-here"
	d.HasAuth, d.AuthFD = true, 1<<20
	_, err = Fetch(context.Background(), d, FetchOptions{})
	require.ErrorIs(t, err, unix.EBADF)
	require.ErrorIs(t, err, ErrNotOffered)
	require.ErrorIs(t, err, unix.ECONNREFUSED)

	_, err = Fetch(context.Background(), &handles.Descriptor{}, FetchOptions{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

func TestSocketChecksExporterPID(t *testing.T) {
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	s := smallShare(t, e, 1)
	d := s.Descriptor()
	d.ExporterPID = os.Getppid() // someone else claims our socket
	_, err := Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportSocket}})
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "not the exporter pid")
}

func TestFabricHook(t *testing.T) {
	e := newExporter(t, ExporterOptions{})
	pages := []handles.Fabric{{1, 2}, {3, 4}}
	released := 0
	s, err := e.ShareFabric(pages, Extent{PageSize: 4096, Offset: 100, Length: 5000}, func() error { released++; return nil })
	require.NoError(t, err)
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	d, err := handles.ParseDescriptor(b)
	require.NoError(t, err)
	require.Empty(t, d.Endpoint)
	r, err := Fetch(context.Background(), d, FetchOptions{})
	require.NoError(t, err)
	require.Equal(t, TransportFabric, r.Via)
	require.Equal(t, pages, r.Fabric)
	require.Empty(t, r.FDs)

	_, err = Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportPidfd, TransportSocket}})
	require.ErrorIs(t, err, vmm.ErrNotSupported)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	require.Equal(t, 1, released)
}

func TestProbePidfdGetfd(t *testing.T) {
	err := ProbePidfdGetfd()
	if err != nil {
		require.ErrorIs(t, err, vmm.ErrNotSupported, "an unsure answer is an error of its own")
		return
	}
	require.NoError(t, ProbePidfdGetfd(), "a definite answer is cached")
}

// TestNewExporterRefusesEndpointsNoDescriptorCarries: an endpoint that no
// descriptor can name ("@" alone, which the kernel would bind to a name
// of its own choosing; more than 107 bytes; a NUL) is refused up front,
// before anything listens, instead of making an exporter whose every
// share fails. The longest endpoint a descriptor carries serves.
func TestNewExporterRefusesEndpointsNoDescriptorCarries(t *testing.T) {
	requireNoFDLeak(t)
	long := filepath.Join(t.TempDir(), strings.Repeat("x", 108))
	for _, ep := range []string{"@", "@" + strings.Repeat("x", handles.MaxEndpoint), "@a\x00b", long[:handles.MaxEndpoint+1]} {
		e, err := NewExporter(ExporterOptions{Endpoint: ep})
		require.ErrorIs(t, err, vmm.ErrInvalid, "endpoint %q", ep)
		require.Nil(t, e)
	}
	_, err := os.Stat(long[:handles.MaxEndpoint+1])
	require.ErrorIs(t, err, os.ErrNotExist, "nothing listened")

	for _, ep := range []string{"@" + strings.Repeat("x", handles.MaxEndpoint-1), long[:min(len(long), handles.MaxEndpoint)]} {
		e, err := NewExporter(ExporterOptions{Endpoint: ep})
		require.NoError(t, err, "endpoint %q", ep)
		s := smallShare(t, e, 1)
		require.Equal(t, ep, s.Descriptor().Endpoint)
		r, err := Fetch(context.Background(), s.Descriptor(), FetchOptions{Transports: []Transport{TransportSocket}})
		require.NoError(t, err)
		requireSameFiles(t, s, r.FDs)
		require.NoError(t, r.Close())
		require.NoError(t, e.Close())
	}
}

// TestFailedShareReleasesOnce pins what ShareFDs documents: a share that
// fails has taken its fds (closed) and run its release, once, so that its
// caller must not undo the release itself (ShareBlock relies on it to
// unpin). So do ShareFabric and ShareCUDAIPC.
func TestFailedShareReleasesOnce(t *testing.T) {
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	closed, err := NewExporter(ExporterOptions{NoSocket: true})
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	ok := Extent{PageSize: 4096, Length: 4096}
	for _, c := range []struct {
		name  string
		share func(release func() error) error
		want  error
	}{
		{"zero length", func(r func() error) error {
			_, err := e.ShareFDs(makePages(t, 1, 4096), Extent{PageSize: 4096}, r)
			return err
		}, vmm.ErrInvalid},
		{"nil fd", func(r func() error) error {
			_, err := e.ShareFDs(append(makePages(t, 1, 4096), nil), Extent{PageSize: 4096, Length: 8192}, r)
			return err
		}, vmm.ErrInvalid},
		{"closed exporter", func(r func() error) error {
			_, err := closed.ShareFDs(makePages(t, 2, 4096), Extent{PageSize: 4096, Length: 8192}, r)
			return err
		}, vmm.ErrClosed},
		{"zero fabric handle", func(r func() error) error {
			_, err := e.ShareFabric([]handles.Fabric{{}}, ok, r)
			return err
		}, vmm.ErrInvalid},
		{"cuda-ipc on a closed exporter", func(r func() error) error {
			_, err := closed.ShareCUDAIPC(handles.IPCHandle{1}, ok, r)
			return err
		}, vmm.ErrClosed},
	} {
		var released int
		err := c.share(func() error { released++; return nil })
		require.ErrorIs(t, err, c.want, c.name)
		require.Equal(t, 1, released, "%s: the failed share ran its release once", c.name)
	}
}

// TestFetchStopsWhenCancelled: a socket exchange stops when its context
// is cancelled, as Fetch and Open say ctx bounds it, not only at the
// context's deadline (here it has none) or after defaultTimeout: an
// exporter that accepts and never answers (stopped, or all its slots
// taken) holds the importer no longer than its caller wants. So for the
// fds by socket, a cuda-ipc lease, and the lease after a pidfd fetch, by
// Fetch and by Open.
func TestFetchStopsWhenCancelled(t *testing.T) {
	requireNoFDLeak(t)
	imp := backendDriver(t, "host") // checked for leaks once the listener is gone
	silent := silentListener(t, "@xseg-silent-cancel-")
	posix := &handles.Descriptor{
		Kind: handles.KindPosixFD, ExporterPID: os.Getpid(), PageSize: 4096, PageCount: 1,
		Length: 4096, Token: handles.Token{1}, Endpoint: silent,
	}
	cudaIPC := *posix
	cudaIPC.Kind, cudaIPC.IPC = handles.KindCUDAIPC, handles.IPCHandle{1}
	cudaIPC.ExporterPID = os.Getppid() // Open refuses its own process's handles
	type fetchCase struct {
		name  string
		fetch func(ctx context.Context) error
	}
	cases := []fetchCase{
		{"socket", func(ctx context.Context) error {
			_, err := Fetch(ctx, posix, FetchOptions{Transports: []Transport{TransportSocket}})
			return err
		}},
		{"cuda-ipc", func(ctx context.Context) error {
			cudaIPC := cudaIPC
			cudaIPC.ExporterPID = os.Getpid() // served by our silent socket
			_, err := Fetch(ctx, &cudaIPC, FetchOptions{})
			return err
		}},
		{"open socket", func(ctx context.Context) error {
			b, err := posix.MarshalBinary()
			require.NoError(t, err)
			_, err = Open(ctx, b, imp, 0, socketOnly)
			return err
		}},
	}
	if ProbePidfdGetfd() == nil {
		e := newExporter(t, ExporterOptions{NoSocket: true})
		const ps = 2 << 20 // the importing host driver's granularity
		s, err := e.ShareFDs(makePages(t, 1, ps), Extent{PageSize: ps, Length: ps}, nil)
		require.NoError(t, err)
		d := s.Descriptor()
		d.Endpoint = silent
		pidfdOnly := FetchOptions{Transports: []Transport{TransportPidfd}}
		cases = append(cases, fetchCase{"pidfd lease", func(ctx context.Context) error {
			_, err := Fetch(ctx, d, pidfdOnly)
			return err
		}}, fetchCase{"open pidfd lease", func(ctx context.Context) error {
			b, err := d.MarshalBinary()
			require.NoError(t, err)
			_, err = Open(ctx, b, imp, 0, OpenOptions{Fetch: pidfdOnly})
			return err
		}})
	}
	for _, c := range cases {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		err := c.fetch(ctx)
		require.ErrorIs(t, err, context.Canceled, c.name)
		require.Less(t, time.Since(start), 3*time.Second, "%s: the exchange stopped at the cancel", c.name)
	}
}
