package ipc

import (
	"encoding/binary"
	"fmt"

	"github.com/xseg-dev/xseg/handles"
)

// The socket protocol, version 2, over a SOCK_SEQPACKET Unix socket (so
// message boundaries hold and fds stay with their message):
//
//	importer -> exporter  request: "XSRQ" version(2) flags(1) token(16) [nonce(u64)]
//	exporter -> importer  reply:   "XSRS" version(2) status(1) count(u32) n(u16) message(n)
//	exporter -> importer  count fds in batches of at most maxBatch, each a
//	                      message "XSRB" index(u32) with the fds as SCM_RIGHTS
//
// Integers are little endian. A refusal is a reply with a non-zero status
// and a message saying why; the exporter then closes the connection. A
// peer the exporter's policy refuses gets its reply at once, before the
// exporter reads anything from it (so its request may meet a closed
// socket: the importer reads the reply even when sending failed), and the
// reply says no more than "refused by the exporter's policy". The
// flag flagLeaseOnly asks for no fds (count 0): an importer that fetched
// the fds with pidfd_getfd takes its lease that way. The flag flagClaim
// says that the importer claimed the share (handles.ClaimFor) with the
// nonce that follows the token; the exporter serves a share that has a
// claim memfd only to its claimant, and claims it for a requester that
// brings no nonce.
//
// After a successful exchange the connection is the importer's lease on
// the share: the exporter keeps the share's pages pinned until the
// importer closes it, or dies and the kernel closes it. Neither side sends
// anything more.
const (
	protoVersion = 2
	requestSize  = 4 + 1 + 1 + 16
	nonceSize    = 8
	replyHeader  = 4 + 1 + 1 + 4 + 2
	batchSize    = 4 + 4
	maxMessage   = 512
	// maxBatch is the most fds one message carries: the kernel's
	// SCM_MAX_FD is 253.
	maxBatch = 253
)

// flags of a request.
const (
	flagLeaseOnly byte = 1 << iota
	flagClaim
	knownFlags = flagLeaseOnly | flagClaim
)

// status of a reply.
const (
	statusOK byte = iota
	statusRefused
	statusUnknownShare
	statusBadRequest
	statusBusy
)

// A requestMsg names a share by its token; with flagClaim it carries the
// nonce its importer claimed the share with (never zero).
type requestMsg struct {
	tok   handles.Token
	flags byte
	nonce uint64
}

func encodeRequest(r requestMsg) []byte {
	b := append([]byte("XSRQ"), protoVersion, r.flags)
	b = append(b, r.tok[:]...)
	if r.flags&flagClaim != 0 {
		b = binary.LittleEndian.AppendUint64(b, r.nonce)
	}
	return b
}

func decodeRequest(b []byte) (requestMsg, error) {
	var r requestMsg
	if len(b) < requestSize || string(b[:4]) != "XSRQ" || b[4] != protoVersion || b[5]&^knownFlags != 0 {
		return r, fmt.Errorf("malformed request of %d bytes", len(b))
	}
	r.flags = b[5]
	copy(r.tok[:], b[6:])
	want := requestSize
	if r.flags&flagClaim != 0 {
		want += nonceSize
	}
	if len(b) != want {
		return requestMsg{}, fmt.Errorf("malformed request of %d bytes (flags %#x: %d)", len(b), r.flags, want)
	}
	if r.flags&flagClaim != 0 {
		if r.nonce = binary.LittleEndian.Uint64(b[requestSize:]); r.nonce == 0 {
			return requestMsg{}, fmt.Errorf("malformed request: a claim with a zero nonce")
		}
	}
	return r, nil
}

func encodeReply(status byte, count int, msg string) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b := append([]byte("XSRS"), protoVersion, status)
	b = binary.LittleEndian.AppendUint32(b, uint32(count))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

func decodeReply(b []byte) (status byte, count int, msg string, err error) {
	if len(b) < replyHeader || string(b[:4]) != "XSRS" || b[4] != protoVersion {
		return 0, 0, "", fmt.Errorf("malformed reply of %d bytes", len(b))
	}
	n := int(binary.LittleEndian.Uint16(b[10:]))
	if len(b) != replyHeader+n || n > maxMessage {
		return 0, 0, "", fmt.Errorf("malformed reply: message of %d bytes in %d", n, len(b))
	}
	return b[5], int(binary.LittleEndian.Uint32(b[6:])), string(b[replyHeader:]), nil
}

func encodeBatch(index int) []byte {
	return binary.LittleEndian.AppendUint32([]byte("XSRB"), uint32(index))
}
