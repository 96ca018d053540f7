package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestService runs the service's handler on the host backend: appends
// grow the buffer in place, vectors read back intact, and /stats and
// /metrics report the buffer.
func TestService(t *testing.T) {
	d, err := host.Open(host.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	vmmtest.CheckLeaks(t, d)
	defer func() { require.NoError(t, d.Close()) }()
	s, err := newStore(d, 4, 8<<20)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.close()) }()
	srv := httptest.NewServer(newHandler(s, d.Backend(), slog.New(slog.DiscardHandler)))
	defer srv.Close()
	addr := s.buf.Ptr()

	code, body := post(t, srv.URL+"/append", `{"vectors": [[1,2,3,4],[0.5,-1,1e9,7]]}`)
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"first":0,"count":2}`, body)
	// 2 MiB of vectors more: the buffer grows past its first page.
	big := make([][]float32, (2<<20)/16)
	for i := range big {
		big[i] = []float32{float32(i), 0, 0, 1}
	}
	raw, err := json.Marshal(map[string]any{"vectors": big})
	require.NoError(t, err)
	code, body = post(t, srv.URL+"/append", string(raw))
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"first":2,"count":131072}`, body)
	require.Equal(t, addr, s.buf.Ptr(), "the buffer keeps its address")

	code, body = get(t, srv.URL+"/vector?i=1")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `[0.5,-1,1e9,7]`, body, "written before the grow, read after it")
	code, body = get(t, srv.URL+"/vector?i=131073")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `[131071,0,0,1]`, body)

	code, body = get(t, srv.URL+"/stats")
	require.Equal(t, http.StatusOK, code)
	var st struct {
		Vectors, Dim     int
		Backend, Address string
		Len, Cap, Max    uint64
	}
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	require.Equal(t, 131074, st.Vectors)
	require.Equal(t, "host", st.Backend)
	require.Equal(t, addr.String(), st.Address)
	require.Equal(t, uint64(131074*16), st.Len)
	require.Equal(t, uint64(4<<20), st.Cap)
	require.Equal(t, uint64(8<<20), st.Max)

	code, body = get(t, srv.URL+"/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `xseg_allocated_bytes{backend="host",device="0",pool="large"} 2.097184e+06`)
	require.Contains(t, body, `xseg_reserved_bytes{backend="host",device="0",pool="large"} 4.194304e+06`)
	require.Contains(t, body, `xseg_maps_total{backend="host",device="0"} 2`)
	require.Contains(t, body, `xseg_set_access_calls_total{backend="host",device="0"} 2`)

	code, body = post(t, srv.URL+"/append", `{"vectors": [[1,2,3]]}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "vector 0 has 3 values, want 4")
	code, _ = get(t, srv.URL+"/vector?i=131074")
	require.Equal(t, http.StatusBadRequest, code)
	// Past the buffer's maximum: 507 and nothing changes.
	raw, err = json.Marshal(map[string]any{"vectors": append(append(big, big...), big...)})
	require.NoError(t, err)
	code, body = post(t, srv.URL+"/append", string(raw))
	require.Equal(t, http.StatusInsufficientStorage, code, body)
	require.Contains(t, body, "past its maximum of 8388608 bytes")
	require.Equal(t, 131074, s.count())
}

// TestAppendChecksBeforeAllocating: a request with many vectors of the
// wrong length is refused without first making room for all of them. The
// room was the request's count of vectors times the vector size: a 64 MiB
// body of "[]," asks for 22 million vectors, 68 GB at the default -dim 768,
// and the server died with "fatal error: runtime: out of memory".
func TestAppendChecksBeforeAllocating(t *testing.T) {
	d := vmmtest.HostDriver(t, 1<<30)
	const dim = 1024 // 4 KiB a vector
	s, err := newStore(d, dim, 8<<20)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.close()) }()
	vecs := make([][]float32, 1<<20) // empty vectors: 4 GiB of room before the fix
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = s.add(vecs)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Contains(t, err.Error(), "vector 0 has 0 values, want 1024")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated to refuse the request")
	require.Zero(t, s.count())
}

// gatedCopies is a driver whose CopyHtoD says it has begun on entered,
// then waits for gate and fails with fail if it is set.
type gatedCopies struct {
	vmm.Driver
	entered, gate chan struct{}
	fail          error
}

func (g *gatedCopies) CopyHtoD(dst vmm.DevicePtr, src []byte) error {
	g.entered <- struct{}{}
	<-g.gate
	if g.fail != nil {
		return g.fail
	}
	return g.Driver.CopyHtoD(dst, src)
}

// TestAppendIsAtomic: while an append writes its vectors they cannot be
// read (before, a concurrent GET /vector read the grown but unwritten
// memory: zeros here, stale device memory on a GPU), and an append whose
// write fails leaves nothing behind (before, its unwritten vectors were
// counted and served, and the next append came after them).
func TestAppendIsAtomic(t *testing.T) {
	g := &gatedCopies{Driver: vmmtest.HostDriver(t, 1<<30), entered: make(chan struct{}), gate: make(chan struct{})}
	s, err := newStore(g, 4, 8<<20)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.close()) }()

	for _, fail := range []error{vmmtest.ErrInjected, nil} {
		g.fail = fail
		done := make(chan error, 1)
		go func() {
			_, err := s.add([][]float32{{1, 2, 3, 4}})
			done <- err
		}()
		<-g.entered // grown, not written yet
		_, err := s.get(0)
		require.ErrorIs(t, err, vmm.ErrInvalid, "reading a vector being written (fail=%v)", fail)
		require.Zero(t, s.count())
		g.gate <- struct{}{}
		err = <-done
		if fail != nil {
			require.ErrorIs(t, err, fail)
			require.Zero(t, s.count(), "a failed append counts no vector")
			require.Zero(t, s.buf.Len(), "a failed append leaves the buffer as it was")
			_, err = s.get(0)
			require.ErrorIs(t, err, vmm.ErrInvalid)
			continue
		}
		require.NoError(t, err)
	}
	require.Equal(t, 1, s.count())
	v, err := s.get(0)
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2, 3, 4}, v)
}
