package main

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// childEnv marks the test binary run as the consumer process.
const childEnv = "XSEG_SHARING_CONSUMER"

// TestSharing runs the producer here and the consumer as a second process
// (this test binary again, as TestConsumerProcess), on the host backend.
func TestSharing(t *testing.T) {
	var out bytes.Buffer
	err := produce("host", &out, func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestConsumerProcess$", "-test.v=false")
		cmd.Env = append(os.Environ(), childEnv+"=1")
		return cmd
	})
	require.NoError(t, err, out.String())
	require.Equal(t, "producer: sharing 5243003 bytes in 3 pages of 2 MiB (host backend)\n"+
		"consumer: fetched 3 page fds, mapped them, read \"hello from the producer\" and checked 5243003 bytes\n"+
		"PASS\n"+
		"producer: the consumer is done\n", out.String())
}

// TestConsumerProcess is the consumer when TestSharing starts it.
func TestConsumerProcess(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("the consumer process of TestSharing; runs only when it starts this binary")
	}
	if err := consume("host", os.Stdin, os.Stdout); err != nil {
		t.Fatal(err)
	}
}
