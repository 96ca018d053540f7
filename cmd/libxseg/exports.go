package main

/*
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
*/
import "C"

import (
	"fmt"
	"os"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// lib is the process's one library, reading the process environment and
// opening its driver through xseg.OpenDriver at first use.
var lib = newLibrary(os.Getenv, xseg.OpenDriver)

// lastErr keeps the text of the most recent failure for xseg_last_error.
var lastErr lastError

func main() {}

// fail records the failure of the C function name, for xseg_last_error
// and for the calling thread's xseg_thread_error, and logs it, all bounded
// in length.
func fail(name string, err error) {
	msg := boundText(name + ": " + err.Error())
	lastErr.set(msg)
	setThreadError(msg)
	lib.log.Warn("xseg: call failed", "err", msg)
}

// catch, deferred by every export, turns a panic into a recorded failure:
// a panic never crosses into C. The export's results keep the values they
// had, which each export arranges to be its failure value.
//
// Every export but the plain allocation and free (which defer catchPlain)
// defers it, and so starts a new epoch of the free queue when it returns
// (freequeue.go): no block remembered before the call is taken back after
// it.
func catch(name string) {
	newEpoch()
	if r := recover(); r != nil {
		fail(name, fmt.Errorf("panic: %v", r))
	}
}

// catchPlain is catch for the plain allocation and free, which leave the
// epoch as it is.
func catchPlain(name string) {
	if r := recover(); r != nil {
		fail(name, fmt.Errorf("panic: %v", r))
	}
}

// status turns an error into the C API's 0 or -1, recording a failure.
func status(name string, err error) C.int {
	if err != nil {
		fail(name, err)
		return -1
	}
	return 0
}

// jsonOut hands a JSON document to C as a string the caller frees with
// xseg_string_free, or records err and returns NULL.
func jsonOut(name string, b []byte, err error) *C.char {
	if err != nil {
		fail(name, err)
		return nil
	}
	return C.CString(string(b))
}

//export xsegGoMalloc
func xsegGoMalloc(size C.ssize_t, device C.int, stream C.uintptr_t, epoch *C.uint32_t) (ptr C.uintptr_t) {
	defer catchPlain("xseg_malloc")
	drainPlain()
	p, err := mallocPlain(int64(size), int(device), vmm.Stream(stream), epoch)
	if err != nil {
		fail("xseg_malloc", fmt.Errorf("%d bytes on device %d: %w", int64(size), int(device), err))
		return 0
	}
	return C.uintptr_t(p)
}

// xsegGoMallocOrError is xsegGoMalloc that also hands this call's error
// to the caller (see mallocError), so that xseg_malloc_or_throw can throw
// it without racing other threads' failures.
//
//export xsegGoMallocOrError
func xsegGoMallocOrError(size C.ssize_t, device C.int, stream C.uintptr_t, errText **C.char, oom *C.int, epoch *C.uint32_t) (ptr C.uintptr_t) {
	defer catchPlain("xseg_malloc")
	drainPlain()
	p, err := mallocPlain(int64(size), int(device), vmm.Stream(stream), epoch)
	if err != nil {
		err = fmt.Errorf("%d bytes on device %d: %w", int64(size), int(device), err)
		fail("xseg_malloc", err)
		mallocError(int64(size), int(device), err, errText, oom)
		return 0
	}
	return C.uintptr_t(p)
}

//export xsegGoFree
func xsegGoFree(ptr C.uintptr_t, size C.ssize_t, device C.int, stream C.uintptr_t) {
	defer catchPlain("xseg_free")
	drainPlain()
	if err := lib.free(vmm.DevicePtr(ptr), int(device)); err != nil {
		fail("xseg_free", fmt.Errorf("%#x (%d bytes) on device %d: %w", uintptr(ptr), int64(size), int(device), err))
	}
}

//export xsegGoRecordStream
func xsegGoRecordStream(ptr C.uintptr_t, stream C.uintptr_t) (rc C.int) {
	rc = -1
	defer catch("xseg_record_stream")
	drainFrees()
	known, err := lib.recordStream(vmm.DevicePtr(ptr), vmm.Stream(stream))
	switch {
	case err != nil:
		fail("xseg_record_stream", fmt.Errorf("%#x on stream %#x: %w", uintptr(ptr), uintptr(stream), err))
		return -1
	case !known:
		return 1
	}
	return 0
}

//export xsegGoStatsJSON
func xsegGoStatsJSON(device C.int) (s *C.char) {
	defer catch("xseg_stats_json")
	drainFrees()
	b, err := lib.statsJSON(int(device))
	return jsonOut("xseg_stats_json", b, err)
}

//export xsegGoSnapshotJSON
func xsegGoSnapshotJSON(device C.int) (s *C.char) {
	defer catch("xseg_snapshot_json")
	drainFrees()
	b, err := lib.snapshotJSON(int(device))
	return jsonOut("xseg_snapshot_json", b, err)
}

//export xsegGoEmptyCache
func xsegGoEmptyCache(device C.int) (rc C.int) {
	rc = -1
	defer catch("xseg_empty_cache")
	drainFrees()
	return status("xseg_empty_cache", lib.emptyCache(int(device)))
}

//export xsegGoEmptyCacheHook
func xsegGoEmptyCacheHook() (rc C.int) {
	rc = -1
	defer catch("xseg_empty_cache_hook")
	drainFrees()
	return status("xseg_empty_cache_hook", lib.emptyCacheHook())
}

//export xsegGoResetPeakStats
func xsegGoResetPeakStats(device C.int) (rc C.int) {
	rc = -1
	defer catch("xseg_reset_peak_stats")
	drainFrees()
	return status("xseg_reset_peak_stats", lib.resetPeakStats(int(device)))
}

//export xsegGoResetAccumulatedStats
func xsegGoResetAccumulatedStats(device C.int) (rc C.int) {
	rc = -1
	defer catch("xseg_reset_accumulated_stats")
	drainFrees()
	return status("xseg_reset_accumulated_stats", lib.resetAccumulatedStats(int(device)))
}

//export xsegGoConfigure
func xsegGoConfigure(conf *C.char) (rc C.int) {
	rc = -1
	defer catch("xseg_configure")
	drainFrees()
	s := ""
	if conf != nil {
		s = C.GoString(conf)
	}
	return status("xseg_configure", lib.configure(s))
}

//export xsegGoSetLogLevel
func xsegGoSetLogLevel(level *C.char) (rc C.int) {
	rc = -1
	defer catch("xseg_set_log_level")
	drainFrees()
	if level == nil {
		return status("xseg_set_log_level", fmt.Errorf("log level is NULL: want off, error, warn, info or debug: %w", vmm.ErrInvalid))
	}
	lv, err := parseLevel(C.GoString(level))
	if err == nil {
		lib.level.Set(lv)
	}
	return status("xseg_set_log_level", err)
}

//export xsegGoLastError
func xsegGoLastError() (s *C.char) {
	defer catch("xseg_last_error")
	drainFrees()
	return lastErr.get()
}
