// Command xseg reports what this machine supports and drives the xseg
// allocator with recorded allocation traces.
//
//	xseg info [--json] [--backend auto|host|cuda]
//	xseg replay [--backend auto|host|cuda] [--allocator auto|expandable|fallback]
//	            [--capacity BYTES] [--conf XSEG_CONF] [--json] TRACE...
//
// The command line is built with github.com/spf13/cobra (over spf13/pflag):
// subcommands, generated help and usage, and flag values checked as they
// are parsed (the enumerations and byte sizes below) are what it does well,
// and hand-written flag handling would do them worse.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

func main() {
	cmd := newRootCmd(os.Stdout, os.Stderr)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// errorLine is the line that reports err: "xseg: " and the error, whose
// own "xseg: " (package xseg's errors start so) is not said twice.
func errorLine(err error) string {
	return "xseg: " + strings.TrimPrefix(err.Error(), "xseg: ")
}

// newRootCmd builds the command tree writing to stdout and stderr (tests
// pass buffers).
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "xseg",
		Short: "GPU memory with expandable segments: machine report and trace replay",
		Long: `xseg reports what this machine's GPU driver supports (info) and replays
recorded allocation traces through the xseg allocator, reporting peak memory
and speed (replay). Without a CUDA driver it uses the host backend, which
runs the same allocator on Linux host memory.`,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newInfoCmd(stdout), newReplayCmd(stdout, stderr))
	return root
}
