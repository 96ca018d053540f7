// Command xseg reports what this machine supports and drives the xseg
// allocator with recorded allocation traces.
//
//	xseg info [--json] [--backend auto|host|cuda] [--allocator auto|expandable|fallback]
//	          [--capacity SIZE]
//	xseg replay [--backend auto|host|cuda] [--allocator auto|expandable|fallback]
//	            [--device N] [--capacity SIZE] [--conf XSEG_CONF] [-v|--verbose] [--json]
//	            [--plot FILE.png] [--perturb N [--seed S] [--jitter F] [--write-variants DIR]] TRACE...
//	xseg --version
//
// Sizes are read by package bytesize: 24GiB, 512MiB or plain bytes.
//
// The command line is built with github.com/spf13/cobra (over spf13/pflag):
// subcommands, generated help and usage, and flag values checked as they
// are parsed (the enumerations and byte sizes below) are what it does well,
// and hand-written flag handling would do them worse.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
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
	return "xseg: " + bare(err).Error()
}

// bare is err without the "xseg: " that package xseg's errors start with,
// for an error of package xseg put inside another message (which main
// prefixes once) or into a report; errors.Is and errors.As still see err.
// Every place in this command that wraps or prints an error of package
// xseg goes through it, so that "xseg:" is said once per line.
func bare(err error) error {
	if err == nil || !strings.HasPrefix(err.Error(), xsegPrefix) {
		return err
	}
	return bareError{err}
}

const xsegPrefix = "xseg: "

type bareError struct{ err error }

func (b bareError) Error() string { return strings.TrimPrefix(b.err.Error(), xsegPrefix) }
func (b bareError) Unwrap() error { return b.err }

// flagError names the flag and its value before what is wrong with it:
// "--capacity 24: 24 bytes is not a multiple of ...", not pflag's
// "invalid argument "24" for "--capacity" flag: ...", and then says
// nothing more: the usage text would bury that line.
func flagError(c *cobra.Command, err error) error {
	var bad *pflag.InvalidValueError
	if errors.As(err, &bad) {
		c.SilenceUsage = true
		return fmt.Errorf("--%s %s: %w", bad.GetFlag().Name, bad.GetValue(), worded(bad.Unwrap()))
	}
	return err
}

// worded is err, a flag's error, with strconv's "strconv.ParseInt:
// parsing "x": invalid syntax" (pflag's number and boolean flags) said in
// words, as the flags of this command say theirs.
func worded(err error) error {
	var num *strconv.NumError
	if !errors.As(err, &num) {
		return err
	}
	what := "not a whole number"
	switch num.Func {
	case "ParseFloat":
		what = "not a number"
	case "ParseBool":
		return errors.New("want true or false")
	}
	if errors.Is(num.Err, strconv.ErrRange) {
		what = "out of range"
	}
	return errors.New(what)
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
		Version:       version(),
		SilenceErrors: true,
	}
	root.SetVersionTemplate("xseg {{.Version}}\n")
	root.SetFlagErrorFunc(flagError)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newInfoCmd(stdout), newReplayCmd(stdout, stderr))
	return root
}
