package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
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
	Text string // the line, shortened if long
	Msg  string // what is wrong
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s:%d: %s: %q", e.Name, e.Line, e.Msg, e.Text)
}

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
func Parse(name string, r io.Reader) (*Trace, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	data, err := readAll(br)
	if err != nil {
		return nil, fmt.Errorf("reading trace %s: %w", name, err)
	}
	lines := bytes.Count(data, []byte{'\n'}) + 1
	p := parser{t: &Trace{Name: name, Events: make([]Event, 0, lines)}, ids: make(map[uint64]uint32, lines/2)}
	if err := p.parse(data); err != nil {
		return nil, err
	}
	return p.finish(), nil
}

// readAll returns the decompressed bytes of br.
func readAll(br *bufio.Reader) ([]byte, error) {
	magic, err := br.Peek(2)
	if err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		return io.ReadAll(zr)
	}
	return io.ReadAll(br)
}

// parser holds the state of one Parse call.
type parser struct {
	t         *Trace
	ids       map[uint64]uint32 // id -> slot
	allocLine []uint32          // by slot
	freeLine  []uint32          // by slot; 0 while live
	sizes     []uint64          // by slot
	streams   map[uint32]uint16 // stream number -> provisional index
	live      uint64
}

func (p *parser) parse(data []byte) error {
	p.streams = make(map[uint32]uint16)
	for lineNo := 1; len(data) > 0; lineNo++ {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if err := p.line(lineNo, line); err != nil {
			return err
		}
	}
	return nil
}

// fail returns the SyntaxError for a line.
func (p *parser) fail(lineNo int, line []byte, format string, args ...any) error {
	text := string(bytes.TrimRight(line, "\r"))
	if len(text) > 80 {
		text = text[:77] + "..."
	}
	return &SyntaxError{Name: p.t.Name, Line: lineNo, Text: text, Msg: fmt.Sprintf(format, args...)}
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
