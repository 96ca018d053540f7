package ipc

import (
	"bytes"
	"testing"

	"github.com/xseg-dev/xseg/handles"
)

// FuzzDecodeRequest feeds arbitrary bytes to decodeRequest, which reads
// what any peer the policy admits sends: it must never panic, and what it
// accepts must be exactly what encodeRequest writes for the result.
func FuzzDecodeRequest(f *testing.F) {
	tok := handles.Token{1, 2, 3, 15: 4}
	for _, r := range []requestMsg{{tok, 0, 0}, {tok, flagLeaseOnly, 0}, {tok, 0x80, 0}, {tok, flagLeaseOnly | flagClaim, 7}, {tok, flagClaim, 0}} {
		b := encodeRequest(r)
		f.Add(b)
		f.Add(b[:len(b)-1])
		f.Add(append(b, 0))
	}
	f.Add([]byte("hello"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeRequest(b)
		if err != nil {
			return
		}
		if got.flags&^knownFlags != 0 {
			t.Fatalf("accepted unknown flags %#x", got.flags)
		}
		if (got.flags&flagClaim != 0) != (got.nonce != 0) {
			t.Fatalf("accepted flags %#x with nonce %#x", got.flags, got.nonce)
		}
		if out := encodeRequest(got); !bytes.Equal(out, b) {
			t.Fatalf("round trip changed the bytes:\n in %x\nout %x", b, out)
		}
	})
}

// FuzzDecodeReply feeds arbitrary bytes to decodeReply, which reads what
// the socket's server sends (anyone can take an abstract name; the
// importer checks the pid, but reads the reply first to say why it
// failed): it must never panic, and what it accepts must re-encode to the
// same bytes.
func FuzzDecodeReply(f *testing.F) {
	for _, b := range [][]byte{
		encodeReply(statusOK, 3, ""),
		encodeReply(statusRefused, 0, refusalMessage),
		encodeReply(statusUnknownShare, 0, "no live share has this token"),
		encodeReply(statusBusy, 1<<31, string(make([]byte, maxMessage))),
	} {
		f.Add(b)
		f.Add(b[:len(b)-1])
		f.Add(append(b, 'x'))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		status, count, msg, err := decodeReply(b)
		if err != nil {
			return
		}
		if len(msg) > maxMessage {
			t.Fatalf("accepted a message of %d bytes", len(msg))
		}
		if out := encodeReply(status, count, msg); !bytes.Equal(out, b) {
			t.Fatalf("round trip changed the bytes:\n in %x\nout %x", b, out)
		}
	})
}
