package vmmtest

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// stream makes a stream and destroys it when the test ends, unless the test
// did.
func (e *env) stream() vmm.Stream {
	e.t.Helper()
	s, err := e.d.StreamCreate(e.dev)
	require.NoError(e.t, err, "StreamCreate(%d)", e.dev)
	require.NotZero(e.t, s, "StreamCreate returned the default stream")
	e.t.Cleanup(func() {
		if err := e.d.StreamDestroy(s); !gone(err) {
			e.t.Errorf("cleanup: StreamDestroy(%#x): %v", uintptr(s), err)
		}
	})
	return s
}

// event makes an event and destroys it when the test ends, unless the test
// did.
func (e *env) event() vmm.Event {
	e.t.Helper()
	ev, err := e.d.EventCreate(e.dev)
	require.NoError(e.t, err, "EventCreate(%d)", e.dev)
	e.t.Cleanup(func() {
		if err := e.d.EventDestroy(ev); !gone(err) {
			e.t.Errorf("cleanup: EventDestroy(%#x): %v", uintptr(ev), err)
		}
	})
	return ev
}

// testStreams checks stream life: create, synchronize, destroy once.
func testStreams(t *testing.T, c Config) {
	e := openAny(t, c)
	s1 := e.stream()
	s2 := e.stream()
	require.NotEqual(t, s1, s2, "two live streams are the same")
	require.NoError(t, e.d.StreamSynchronize(s1), "StreamSynchronize of an idle stream")
	require.NoError(t, e.d.StreamSynchronize(0), "StreamSynchronize of the default stream")
	require.NoError(t, e.d.StreamDestroy(s1))
	requireIs(t, e.d.StreamDestroy(s1), vmm.ErrInvalid, "StreamDestroy twice")
	requireIs(t, e.d.StreamSynchronize(s1), vmm.ErrInvalid, "StreamSynchronize of a destroyed stream")
	require.NoError(t, e.d.StreamSynchronize(s2), "the other stream still works")
}

// testEvents checks event life and order: an event recorded on a stream
// has completed once the stream is synchronized.
func testEvents(t *testing.T, c Config) {
	e := openAny(t, c)
	s := e.stream()
	ev := e.event()
	// An event that was never recorded counts as complete (as in CUDA).
	done, err := e.d.EventQuery(ev)
	require.NoError(t, err, "EventQuery of a fresh event")
	require.True(t, done, "a fresh event is complete")

	const n = 8 << 20
	p := e.memAlloc(n)
	require.NoError(t, MemsetAsync(e.d, p, 1, n, s), "MemsetAsync")
	require.NoError(t, e.d.EventRecord(ev, s), "EventRecord")
	require.NoError(t, e.d.StreamSynchronize(s))
	done, err = e.d.EventQuery(ev)
	require.NoError(t, err, "EventQuery")
	require.True(t, done, "event recorded on a synchronized stream has not completed")
	require.True(t, bytes.Equal(bytes.Repeat([]byte{1}, n), e.read(p, n)), "bytes of MemsetAsync after StreamSynchronize")

	// The event orders the work queued before it.
	require.NoError(t, MemsetAsync(e.d, p, 2, n, s), "MemsetAsync")
	require.NoError(t, e.d.EventRecord(ev, s), "EventRecord")
	require.NoError(t, e.d.EventSynchronize(ev), "EventSynchronize")
	require.True(t, bytes.Equal(bytes.Repeat([]byte{2}, n), e.read(p, n)), "bytes of MemsetAsync after EventSynchronize")

	require.NoError(t, e.d.EventRecord(ev, 0), "EventRecord on the default stream")
	require.NoError(t, e.d.EventSynchronize(ev), "EventSynchronize after a record on the default stream")
	done, err = e.d.EventQuery(ev)
	require.NoError(t, err)
	require.True(t, done, "event has not completed after EventSynchronize")

	dead := e.stream()
	require.NoError(t, e.d.StreamDestroy(dead))
	requireIs(t, e.d.EventRecord(ev, dead), vmm.ErrInvalid, "EventRecord on a destroyed stream")
	requireIs(t, MemsetAsync(e.d, p, 3, n, dead), vmm.ErrInvalid, "MemsetAsync on a destroyed stream")
	require.NoError(t, e.d.EventDestroy(ev))
	requireIs(t, e.d.EventDestroy(ev), vmm.ErrInvalid, "EventDestroy twice")
	_, err = e.d.EventQuery(ev)
	requireIs(t, err, vmm.ErrInvalid, "EventQuery of a destroyed event")
	requireIs(t, e.d.EventSynchronize(ev), vmm.ErrInvalid, "EventSynchronize of a destroyed event")
	requireIs(t, e.d.EventRecord(ev, s), vmm.ErrInvalid, "EventRecord of a destroyed event")
}

// testEventOtherDevice checks that an event is recorded only on a stream of
// its own device (or the default stream): CUDA refuses an event and a
// stream of two contexts, so every backend refuses it with ErrInvalid.
func testEventOtherDevice(t *testing.T, c Config) {
	e := openAny(t, c)
	peer := e.peer()
	ev := e.event()
	s, err := e.d.StreamCreate(peer)
	require.NoError(t, err, "StreamCreate(%d)", peer)
	defer func() { require.NoError(t, e.d.StreamDestroy(s)) }()
	requireIs(t, e.d.EventRecord(ev, s), vmm.ErrInvalid, "EventRecord of an event of device %d on a stream of device %d", e.dev, peer)
	require.NoError(t, e.d.EventRecord(ev, e.stream()), "EventRecord on a stream of the event's device")
	require.NoError(t, e.d.EventRecord(ev, 0), "EventRecord on the default stream")
}
