package vmmtest

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// LogRecorder is a slog handler that keeps every message, and calls OnMsg
// (set it with SetOnMsg) for each: tests that check what an allocator
// logged, or act at the moment it logs.
type LogRecorder struct {
	mu    sync.Mutex
	msgs  []string
	onMsg func(string)
}

func (l *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *LogRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *LogRecorder) WithGroup(string) slog.Handler            { return l }

// Handle records r's message, then calls the OnMsg function outside the
// lock.
func (l *LogRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	f := l.onMsg
	l.mu.Unlock()
	if f != nil {
		f(r.Message)
	}
	return nil
}

// SetOnMsg sets the function called for each message (nil: none).
func (l *LogRecorder) SetOnMsg(f func(string)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onMsg = f
}

// Contains reports whether a message containing sub was logged.
func (l *LogRecorder) Contains(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.msgs, func(m string) bool { return strings.Contains(m, sub) })
}

// CaptureEnv is what the private-pool tests of both allocators run on: the
// test's driver wrapped as Faulty(CaptureGuard(d)), a LogRecorder for the
// allocator's log, and two streams of d: S, the capturing one, and Side.
type CaptureEnv struct {
	G       *CaptureGuard
	F       *Faulty
	Log     *LogRecorder
	S, Side vmm.Stream
}

// NewCaptureEnv makes the environment over d and the allocator under test
// with open (given the wrapped driver and a logger). At the test's end it
// disarms the guard, closes the allocator and destroys the streams.
func NewCaptureEnv[A io.Closer](t testing.TB, d vmm.Driver, open func(vmm.Driver, *slog.Logger) (A, error)) (*CaptureEnv, A) {
	t.Helper()
	g := &CaptureGuard{Driver: d}
	e := &CaptureEnv{G: g, F: NewFaulty(g), Log: &LogRecorder{}}
	a, err := open(e.F, slog.New(e.Log))
	require.NoError(t, err)
	e.S, err = d.StreamCreate(0)
	require.NoError(t, err)
	e.Side, err = d.StreamCreate(0)
	require.NoError(t, err)
	t.Cleanup(func() {
		g.Armed.Store(0)
		require.NoError(t, a.Close())
		require.NoError(t, d.StreamDestroy(e.S))
		require.NoError(t, d.StreamDestroy(e.Side))
	})
	return e, a
}
