package main

/*
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "forked.h"

// The calling thread's last failure, for xseg_thread_error: fail runs on
// the thread of the C caller whose call failed (a call from C into Go runs
// on the caller's own thread), so a buffer per thread keeps each thread's
// own. It is made at the thread's first failure and freed when the thread
// exits (the key's destructor); a __thread array would not do, as a
// library loaded with dlopen has little static TLS room. Its size holds
// the longest text boundText makes.
enum { xseg_thread_err_cap = 4096 + 1 };
static pthread_key_t xseg_thread_err_key;
static pthread_once_t xseg_thread_err_once = PTHREAD_ONCE_INIT;
static int xseg_thread_err_ok;

static void xseg_thread_err_init(void) { xseg_thread_err_ok = pthread_key_create(&xseg_thread_err_key, free) == 0; }

static void xseg_set_thread_error(const char* msg, size_t n) {
	pthread_once(&xseg_thread_err_once, xseg_thread_err_init);
	if (!xseg_thread_err_ok) {
		return;
	}
	char* buf = pthread_getspecific(xseg_thread_err_key);
	if (buf == NULL) {
		if ((buf = malloc(xseg_thread_err_cap)) == NULL || pthread_setspecific(xseg_thread_err_key, buf) != 0) {
			free(buf);
			return;
		}
	}
	if (n > xseg_thread_err_cap - 1) {
		n = xseg_thread_err_cap - 1;
	}
	memcpy(buf, msg, n);
	buf[n] = 0;
}

const char* xseg_thread_error(void) {
	if (xseg_forked) {
		return xseg_fork_error;
	}
	pthread_once(&xseg_thread_err_once, xseg_thread_err_init);
	const char* buf = xseg_thread_err_ok ? pthread_getspecific(xseg_thread_err_key) : NULL;
	return buf != NULL ? buf : "";
}
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

// setThreadError makes msg, already bounded, the calling thread's last
// error for xseg_thread_error. C copies it at once and keeps no pointer.
func setThreadError(msg string) {
	C.xseg_set_thread_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
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
