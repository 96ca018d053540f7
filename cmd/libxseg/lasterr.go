package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"unicode/utf8"
	"unsafe"
)

// retiredErrors is how many replaced error texts stay allocated, so that a
// pointer xseg_last_error returned stays valid while 64 more failures
// happen on other threads.
const retiredErrors = 64

// maxErrorLen bounds the text of the last error: a failure's message may
// carry the caller's input (a configuration string, a log level), and
// xseg_last_error must not hand back megabytes of it.
const maxErrorLen = 4 << 10

// boundText returns msg, or its first bytes (whole UTF-8 characters) and
// "..." if it is longer than maxErrorLen.
func boundText(msg string) string {
	if len(msg) <= maxErrorLen {
		return msg
	}
	cut := maxErrorLen - len("...")
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "..."
}

// emptyText is the "" that xseg_last_error returns before any failure. It
// lives for the whole process.
var emptyText = C.CString("")

// lastError keeps the text of the most recent failure of any thread in C
// memory, for xseg_last_error. It is safe for concurrent use: readers load
// the current text without a lock; writers serialise on mu, and free a text
// only once retiredErrors newer ones replaced it.
type lastError struct {
	cur atomic.Pointer[C.char]
	mu  struct {
		sync.Mutex
		text    string
		retired [retiredErrors]*C.char
		next    int
	}
}

// set makes msg, bounded by boundText, the last error.
func (e *lastError) set(msg string) {
	msg = boundText(msg)
	c := C.CString(msg)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mu.text = msg
	old := e.cur.Swap(c)
	if old == nil {
		return
	}
	if r := e.mu.retired[e.mu.next]; r != nil {
		C.free(unsafe.Pointer(r))
	}
	e.mu.retired[e.mu.next] = old
	e.mu.next = (e.mu.next + 1) % retiredErrors
}

// get returns the last error's text in C memory, "" if none.
func (e *lastError) get() *C.char {
	if c := e.cur.Load(); c != nil {
		return c
	}
	return emptyText
}

// text returns the last error's text, "" if none.
func (e *lastError) text() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.text
}
