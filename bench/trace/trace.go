package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// Op is the kind of an event.
type Op uint8

const (
	// OpAlloc allocates a block.
	OpAlloc Op = 'a'
	// OpFree frees a block allocated earlier.
	OpFree Op = 'f'
)

func (o Op) String() string {
	switch o {
	case OpAlloc:
		return "alloc"
	case OpFree:
		return "free"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Event is one line of a trace.
type Event struct {
	// Size is the number of bytes an OpAlloc asks for; 0 for OpFree.
	Size uint64
	// Slot is the dense number of the block, 0 to Trace.Slots-1: the
	// order of its allocation in the trace.
	Slot uint32
	// Line is the event's line number in the trace, from 1.
	Line uint32
	// Stream is the index of the allocation's stream in Trace.Streams;
	// 0 for OpFree.
	Stream uint16
	// Op is the kind of event.
	Op Op
}

// Trace is a parsed, checked trace.
type Trace struct {
	// Name is the trace's name, usually its path.
	Name string
	// Events are the events in trace order.
	Events []Event
	// Streams are the trace's stream numbers, ascending; Event.Stream
	// indexes this slice.
	Streams []uint32
	// IDs are the trace's ids by slot.
	IDs []uint64
	// Slots is the number of allocations (len(IDs)).
	Slots int
	// PeakLive is the largest sum of the sizes of live blocks at any
	// point of the trace.
	PeakLive uint64
	// LiveAtEnd is the number of blocks never freed.
	LiveAtEnd int
}

// SyntaxError is a line of a trace that does not parse or breaks the
// trace's rules (a duplicate id, a free of an id never allocated).
type SyntaxError struct {
	Name string // the trace's name
	Line int    // line number, from 1
	Text string // at most maxQuoted bytes of the line; "" for a line too long
	Msg  string // what is wrong
}

func (e *SyntaxError) Error() string {
	if e.Text == "" {
		return fmt.Sprintf("%s:%d: %s", e.Name, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %q", e.Name, e.Line, e.Msg, e.Text)
}

// MaxLineLen bounds the length of a trace line, its end included. A real
// event line is at most about 70 bytes; the bound keeps a line without an
// end (a binary file, a run of garbage) from growing the read buffer.
const MaxLineLen = 4 << 10

// maxQuoted is the most bytes of a bad line, or of one bad field, that an
// error quotes: an error about a huge line stays short.
const maxQuoted = 80

// ReadFile reads and parses the trace at path, gzip-compressed or plain.
func ReadFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading trace: %w", err)
	}
	defer f.Close()
	return Parse(path, f)
}

// Parse reads a whole trace from r, gzip-compressed (recognised by its
// magic bytes) or plain text, and checks it. name is used in errors.
//
// It streams: memory grows with the events, never with the input's size,
// so blank lines cost nothing but the time to skip them (a 400 KiB gzip
// of newlines inflates to 400 MB).
func Parse(name string, r io.Reader) (*Trace, error) {
	src, gzipped, err := decompress(bufio.NewReaderSize(r, 1<<16))
	if err != nil {
		return nil, fmt.Errorf("reading trace %s: %w", name, err)
	}
	p := parser{t: &Trace{Name: name}, gzipped: gzipped, ids: make(map[uint64]uint32), streams: make(map[uint32]uint16)}
	if err := p.parse(bufio.NewReaderSize(src, 2*MaxLineLen)); err != nil {
		return nil, err
	}
	return p.finish(), nil
}

// decompress returns the decompressed stream of br, and whether it is
// gzip: br itself for plain text.
func decompress(br *bufio.Reader) (io.Reader, bool, error) {
	magic, err := br.Peek(2)
	if err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		return zr, true, err
	}
	return br, false, nil
}

// parser holds the state of one Parse call.
type parser struct {
	t         *Trace
	gzipped   bool
	ids       map[uint64]uint32 // id -> slot
	allocLine []uint32          // by slot
	freeLine  []uint32          // by slot; 0 while live
	sizes     []uint64          // by slot
	streams   map[uint32]uint16 // stream number -> provisional index
	live      uint64
}

// parse parses the lines of br, whose buffer holds more than MaxLineLen
// bytes, so that a line too long is seen without reading it whole.
func (p *parser) parse(br *bufio.Reader) error {
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadSlice('\n')
		switch {
		case len(line) > MaxLineLen || errors.Is(err, bufio.ErrBufferFull):
			return &SyntaxError{Name: p.t.Name, Line: lineNo, Msg: fmt.Sprintf("line longer than %d bytes", MaxLineLen)}
		case err != nil && err != io.EOF:
			if p.gzipped && errors.Is(err, io.ErrUnexpectedEOF) {
				err = fmt.Errorf("the gzip data ends early (a truncated file, or bytes after it that are not gzip): %w", err)
			}
			return fmt.Errorf("reading trace %s at line %d: %w", p.t.Name, lineNo, err)
		}
		if perr := p.line(lineNo, bytes.TrimSuffix(line, []byte{'\n'})); perr != nil {
			return perr
		}
		if err == io.EOF {
			return nil
		}
	}
}

// fail returns the SyntaxError for a line.
func (p *parser) fail(lineNo int, line []byte, format string, args ...any) error {
	text := clip(bytes.TrimRight(line, "\r"))
	return &SyntaxError{Name: p.t.Name, Line: lineNo, Text: text, Msg: fmt.Sprintf(format, args...)}
}

// clip returns b, or its first bytes and "..." if b is longer than
// maxQuoted: what an error may quote of the input.
func clip(b []byte) string {
	if len(b) > maxQuoted {
		return string(b[:maxQuoted-3]) + "..."
	}
	return string(b)
}

// maxQuotedField is the most bytes of one bad field that an error's
// message quotes, beside the line's maxQuoted.
const maxQuotedField = 24

// clipField is clip for a field named in an error's message.
func clipField(b []byte) string {
	if len(b) > maxQuotedField {
		return string(b[:maxQuotedField-3]) + "..."
	}
	return string(b)
}

// finish turns the provisional stream indexes into indexes of the sorted
// stream list.
func (p *parser) finish() *Trace {
	t := p.t
	for s := range p.streams {
		t.Streams = append(t.Streams, s)
	}
	slices.Sort(t.Streams)
	remap := make([]uint16, len(p.streams))
	for i, s := range t.Streams {
		remap[p.streams[s]] = uint16(i)
	}
	for i := range t.Events {
		if t.Events[i].Op == OpAlloc {
			t.Events[i].Stream = remap[t.Events[i].Stream]
		}
	}
	t.Slots = len(t.IDs)
	for _, l := range p.freeLine {
		if l == 0 {
			t.LiveAtEnd++
		}
	}
	return t
}
