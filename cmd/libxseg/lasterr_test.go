//go:build cgo

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestLastError(t *testing.T) {
	var e lastError
	require.Equal(t, emptyText, e.get())
	require.Empty(t, e.text())
	first := e.get()
	for i := range retiredErrors + 10 {
		e.set(fmt.Sprintf("error %d", i))
	}
	require.Equal(t, fmt.Sprintf("error %d", retiredErrors+9), e.text())
	require.NotEqual(t, first, e.get())
	n := 0
	for _, r := range e.mu.retired {
		if r != nil {
			n++
		}
	}
	require.Equal(t, retiredErrors, n, "older texts are freed, the newest kept")
}

func TestCatch(t *testing.T) {
	rc := func() (rc int) {
		rc = -1
		defer catch("xseg_test")
		panic(errors.New("boom"))
	}()
	require.Equal(t, -1, rc)
	require.Equal(t, "xseg_test: panic: boom", lastErr.text())
}

// Issue 15: a 10 MiB configuration value made a 20 MiB last error. The
// text is cut to maxErrorLen, at a character boundary, ending in "...".
func TestLastErrorBounded(t *testing.T) {
	var e lastError
	e.set(strings.Repeat("x", 10<<20))
	require.Len(t, e.text(), maxErrorLen)
	require.True(t, strings.HasSuffix(e.text(), "..."))
	c := unsafe.Slice((*byte)(unsafe.Pointer(e.get())), maxErrorLen+1)
	require.Equal(t, byte(0), c[maxErrorLen], "the C string is the bounded one")

	e.set(strings.Repeat("é", maxErrorLen)) // two bytes each
	require.True(t, utf8.ValidString(e.text()), "cut between characters")
	require.LessOrEqual(t, len(e.text()), maxErrorLen)

	e.set("short")
	require.Equal(t, "short", e.text())
}

// The errors of exports go through fail: bounded too.
func TestFailBounded(t *testing.T) {
	fail("xseg_test", errors.New(strings.Repeat("y", 1<<20)))
	require.Len(t, lastErr.text(), maxErrorLen)
	require.True(t, strings.HasPrefix(lastErr.text(), "xseg_test: yyy"))
}

// Audit C, D6: xseg_set_log_level(NULL) returned 0 and turned the log
// off; it fails with the reason, and the level stays as it was.
func TestSetLogLevelNull(t *testing.T) {
	before := lib.level.Level()
	t.Cleanup(func() { lib.level.Set(before) })
	lib.level.Set(slog.LevelWarn)
	require.EqualValues(t, -1, xsegGoSetLogLevel(nil))
	require.Equal(t, "xseg_set_log_level: log level is NULL: want off, error, warn, info or debug: invalid argument", lastErr.text())
	require.Equal(t, slog.LevelWarn, lib.level.Level())
}
