package main

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// version is what `xseg --version` prints, from the build information the
// go command writes into the binary: the module's version ("(devel)" for a
// build inside a clone, v1.2.3 for `go install ...@v1.2.3`), and the VCS
// revision, its time and whether the tree had changes, when the build
// recorded them (not with -buildvcs=false, nor for `go run`), then the Go
// version that built it.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build information in this binary)"
	}
	return versionOf(bi)
}

// versionOf formats bi as version describes.
func versionOf(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	var vcs []string
	if r := settings["vcs.revision"]; r != "" {
		vcs = append(vcs, settings["vcs"]+" "+r)
	}
	if t := settings["vcs.time"]; t != "" {
		vcs = append(vcs, t)
	}
	if settings["vcs.modified"] == "true" {
		vcs = append(vcs, "modified")
	}
	if len(vcs) > 0 {
		v += " (" + strings.Join(vcs, ", ") + ")"
	}
	return fmt.Sprintf("%s, built with %s", v, bi.GoVersion)
}
