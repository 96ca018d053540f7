package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersionFlag(t *testing.T) {
	out, _, err := run(t, "--version")
	require.NoError(t, err)
	// A test binary carries build information with the Go version; its
	// main module version is empty or (devel).
	require.Equal(t, "xseg "+version()+"\n", out)
	require.True(t, strings.HasSuffix(strings.TrimSpace(out), ", built with "+runtime.Version()), out)
}

func TestVersionOf(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.25.0", Main: debug.Module{Path: "github.com/xseg-dev/xseg", Version: "v0.2.0"}}
	require.Equal(t, "v0.2.0, built with go1.25.0", versionOf(bi))
	bi.Main.Version = ""
	bi.Settings = []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "ebf3c9e0123456789abcdef0123456789abcdef0"},
		{Key: "vcs.time", Value: "2026-11-23T10:00:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}
	require.Equal(t, "(devel) (git ebf3c9e0123456789abcdef0123456789abcdef0, 2026-11-23T10:00:00Z, modified), built with go1.25.0", versionOf(bi))
	bi.Settings[3].Value = "false"
	require.Equal(t, "(devel) (git ebf3c9e0123456789abcdef0123456789abcdef0, 2026-11-23T10:00:00Z), built with go1.25.0", versionOf(bi))
}
