package trace

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Write writes t in the trace format ReadFile reads: one event a line,
// "a <id> <bytes> <stream>" or "f <id>", with t's ids and stream numbers.
// Parsing what it writes gives t's events, ids, streams and peak back (a
// variant of Perturb included), so a variant can be replayed by another
// allocator's tool. It fails on an event that names a slot or stream t
// does not have.
func (t *Trace) Write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	var line []byte
	for i, e := range t.Events {
		if int(e.Slot) >= len(t.IDs) {
			return fmt.Errorf("writing %s: event %d names slot %d of %d", t.Name, i, e.Slot, len(t.IDs))
		}
		line = line[:0]
		switch e.Op {
		case OpAlloc:
			if int(e.Stream) >= len(t.Streams) {
				return fmt.Errorf("writing %s: event %d names stream %d of %d", t.Name, i, e.Stream, len(t.Streams))
			}
			line = append(line, "a "...)
			line = strconv.AppendUint(line, t.IDs[e.Slot], 10)
			line = append(line, ' ')
			line = strconv.AppendUint(line, e.Size, 10)
			line = append(line, ' ')
			line = strconv.AppendUint(line, uint64(t.Streams[e.Stream]), 10)
		case OpFree:
			line = append(line, "f "...)
			line = strconv.AppendUint(line, t.IDs[e.Slot], 10)
		default:
			return fmt.Errorf("writing %s: event %d has op %v", t.Name, i, e.Op)
		}
		line = append(line, '\n')
		if _, err := bw.Write(line); err != nil {
			return fmt.Errorf("writing %s: %w", t.Name, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing %s: %w", t.Name, err)
	}
	return nil
}

// WriteFile writes t to a new file at path (Write), gzip-compressed when
// path ends in ".gz". It does not replace an existing file; on error it
// removes what it wrote.
func WriteFile(path string, t *Trace) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			err = errors.Join(err, os.Remove(path))
		}
	}()
	if !strings.HasSuffix(path, ".gz") {
		return t.Write(f)
	}
	zw := gzip.NewWriter(f)
	err = t.Write(zw)
	// Close flushes; after a failed write it returns that write's error
	// again (the gzip writer's errors are sticky), which err says already.
	if cerr := zw.Close(); cerr != nil && !errors.Is(err, cerr) {
		err = errors.Join(err, cerr)
	}
	return err
}
