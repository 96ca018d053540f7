package main

/*
#include <stddef.h>
#include <stdlib.h>
*/
import "C"

import (
	"encoding/json"
	"fmt"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// The memory limit (PyTorch's memory_fraction_fn hook) and the allocation
// history (memory_viz) of xseg.h. Each C function is a shim.c wrapper, as
// every other entry point: it refuses in a child forked after the library
// loaded (XSEG_FORK_GUARD) before it calls into Go, where such a child
// may wait forever.

// limiter returns dev's allocator's memory limit, making the allocator if
// need be.
func (l *library) limiter(dev int) (xseg.MemoryLimiter, error) {
	a, err := l.allocator(dev)
	if err != nil {
		return nil, err
	}
	return a, nil
}

// setMemoryFraction limits dev's reserved memory to fraction of its total.
// A bad fraction changes nothing, not even whether dev has an allocator.
func (l *library) setMemoryFraction(fraction float64, dev int) error {
	if !(fraction >= 0 && fraction <= 1) {
		return fmt.Errorf("memory fraction %v on device %d: not in [0, 1]: %w", fraction, dev, vmm.ErrInvalid)
	}
	lim, err := l.limiter(dev)
	if err != nil {
		return err
	}
	return lim.SetMemoryFraction(fraction)
}

// setMemoryLimit limits dev's reserved memory to bytes (0: no limit).
func (l *library) setMemoryLimit(dev int, bytes uint64) error {
	lim, err := l.limiter(dev)
	if err != nil {
		return err
	}
	lim.SetMemoryLimit(bytes)
	return nil
}

// memoryFraction is dev's limit as a fraction of its memory, 0 when there
// is none, or no allocator yet.
func (l *library) memoryFraction(dev int) (float64, error) {
	a, err := l.known(dev)
	if err != nil || a == nil {
		return 0, err
	}
	return a.MemoryFraction(), nil
}

// cacheInfo is PyTorch's cacheInfo for dev (cuDNN's autotuner asks it
// for the most workspace worth trying): an estimate of the largest block
// one allocation could get now. Like PyTorch's own, which starts from the
// driver's free memory, it is optimistic: the driver's free memory plus
// the bytes xseg holds that no block uses or waits on (free pages are
// recycled where a block grows, so they add up), and under a memory limit
// no more than the limit less those in use.
func (l *library) cacheInfo(dev int) (uint64, error) {
	a, err := l.allocator(dev)
	if err != nil {
		return 0, err
	}
	free, _, err := l.driver().MemInfo(vmm.Device(dev))
	if err != nil {
		return 0, fmt.Errorf("memory of device %d: %w", dev, err)
	}
	st := a.Stats()
	reserved, active := uint64(max(0, st.ReservedBytes.All.Current)), uint64(max(0, st.ActiveBytes.All.Current))
	n := free + reserved - min(reserved, active)
	if lim := st.MemoryLimit; st.MemoryLimitSet {
		n = min(n, lim-min(lim, active)) // a fraction of 0 too: nothing can grow
	}
	return n, nil
}

// recordHistory keeps the last maxEntries events of dev (0: none).
func (l *library) recordHistory(dev int, maxEntries uint64) error {
	if maxEntries > xseg.MaxHistoryEntries {
		return fmt.Errorf("history of %d events on device %d: more than %d: %w", maxEntries, dev, xseg.MaxHistoryEntries, vmm.ErrInvalid)
	}
	a, err := l.allocator(dev)
	if err != nil {
		return err
	}
	return a.RecordHistory(int(maxEntries))
}

// historyJSON is dev's history as a JSON array, oldest first; empty for a
// device without an allocator or a history.
func (l *library) historyJSON(dev int) ([]byte, error) {
	a, err := l.known(dev)
	if err != nil {
		return nil, err
	}
	events := []xseg.HistoryEvent{}
	if a != nil {
		if got := a.History(); got != nil {
			events = got
		}
	}
	return json.Marshal(events)
}

//export xsegGoSetMemoryFraction
func xsegGoSetMemoryFraction(fraction C.double, device C.int) {
	defer catch("xseg_set_memory_fraction")
	drainFrees()
	if err := lib.setMemoryFraction(float64(fraction), int(device)); err != nil {
		fail("xseg_set_memory_fraction", err)
	}
}

//export xsegGoMemoryFraction
func xsegGoMemoryFraction(device C.int, out *C.double) (rc C.int) {
	rc = -1
	defer catch("xseg_memory_fraction")
	drainFrees()
	return readInto("xseg_memory_fraction", "out", device, out, lib.memoryFraction, func(f float64) C.double { return C.double(f) })
}

// readInto is the body of an export that reads one value of device
// through get and writes it, converted, through out (the C parameter
// named param): 0, or -1 with the thread's error, out untouched, when out
// is NULL or get fails.
func readInto[V, Out any](name, param string, device C.int, out *Out, get func(int) (V, error), conv func(V) Out) C.int {
	if out == nil {
		return status(name, fmt.Errorf("device %d: %s is NULL: %w", int(device), param, vmm.ErrInvalid))
	}
	v, err := get(int(device))
	if err == nil {
		*out = conv(v)
	}
	return status(name, err)
}

//export xsegGoSetMemoryLimit
func xsegGoSetMemoryLimit(device C.int, bytes C.ulonglong) (rc C.int) {
	rc = -1
	defer catch("xseg_set_memory_limit")
	drainFrees()
	return status("xseg_set_memory_limit", lib.setMemoryLimit(int(device), uint64(bytes)))
}

//export xsegGoCacheInfo
func xsegGoCacheInfo(device C.int, largest *C.size_t) (rc C.int) {
	rc = -1
	defer catch("xseg_cache_info")
	drainFrees()
	return readInto("xseg_cache_info", "largest", device, largest, lib.cacheInfo, func(n uint64) C.size_t { return C.size_t(n) })
}

//export xsegGoRecordHistory
func xsegGoRecordHistory(device C.int, maxEntries C.size_t) (rc C.int) {
	rc = -1
	defer catch("xseg_record_history")
	drainFrees()
	return status("xseg_record_history", lib.recordHistory(int(device), uint64(maxEntries)))
}

//export xsegGoHistoryJSON
func xsegGoHistoryJSON(device C.int) (s *C.char) {
	defer catch("xseg_history_json")
	drainFrees()
	b, err := lib.historyJSON(int(device))
	return jsonOut("xseg_history_json", b, err)
}
