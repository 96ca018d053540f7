//go:build cgo

package main

import (
	"errors"
	"fmt"
	"testing"

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
