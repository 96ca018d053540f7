package trace

import "math"

// maxStreams is the most distinct streams a trace may use (Event.Stream is
// a uint16).
const maxStreams = math.MaxUint16 + 1

// line parses and checks one line.
func (p *parser) line(lineNo int, line []byte) error {
	if uint64(lineNo) > math.MaxUint32 {
		return p.fail(lineNo, line, "trace too long")
	}
	var f [5][]byte
	n := fields(line, f[:])
	switch {
	case n == 0:
		return nil // blank line
	case len(f[0]) != 1 || (f[0][0] != 'a' && f[0][0] != 'f'):
		return p.fail(lineNo, line, "unknown event %q (want a or f)", clipField(f[0]))
	case f[0][0] == 'a' && n != 4:
		return p.fail(lineNo, line, "an allocation has 4 fields (a <id> <bytes> <stream>), this line %d", n)
	case f[0][0] == 'f' && n != 2:
		return p.fail(lineNo, line, "a free has 2 fields (f <id>), this line %d", n)
	}
	id, ok := parseUint(f[1])
	if !ok {
		return p.fail(lineNo, line, "bad id %q (want an unsigned integer)", clipField(f[1]))
	}
	if f[0][0] == 'f' {
		return p.free(lineNo, line, id)
	}
	size, ok := parseUint(f[2])
	if !ok {
		return p.fail(lineNo, line, "bad size %q (want an unsigned integer)", clipField(f[2]))
	}
	stream, ok := parseUint(f[3])
	if !ok || stream > math.MaxUint32 {
		return p.fail(lineNo, line, "bad stream %q (want an unsigned 32-bit integer)", clipField(f[3]))
	}
	return p.alloc(lineNo, line, id, size, uint32(stream))
}

func (p *parser) alloc(lineNo int, line []byte, id, size uint64, stream uint32) error {
	if slot, dup := p.ids[id]; dup {
		return p.fail(lineNo, line, "duplicate id %d (allocated at line %d)", id, p.allocLine[slot])
	}
	if uint64(len(p.t.IDs)) == math.MaxUint32 {
		return p.fail(lineNo, line, "too many allocations")
	}
	si, ok := p.streams[stream]
	if !ok {
		if len(p.streams) == maxStreams {
			return p.fail(lineNo, line, "more than %d streams", maxStreams)
		}
		si = uint16(len(p.streams))
		p.streams[stream] = si
	}
	if p.live > math.MaxUint64-size {
		return p.fail(lineNo, line, "live bytes overflow 64 bits")
	}
	slot := uint32(len(p.t.IDs))
	p.ids[id] = slot
	p.t.IDs = append(p.t.IDs, id)
	p.allocLine = append(p.allocLine, uint32(lineNo))
	p.freeLine = append(p.freeLine, 0)
	p.sizes = append(p.sizes, size)
	p.live += size
	p.t.PeakLive = max(p.t.PeakLive, p.live)
	p.t.Events = append(p.t.Events, Event{Op: OpAlloc, Size: size, Slot: slot, Line: uint32(lineNo), Stream: si})
	return nil
}

func (p *parser) free(lineNo int, line []byte, id uint64) error {
	slot, ok := p.ids[id]
	if !ok {
		return p.fail(lineNo, line, "free of id %d, never allocated", id)
	}
	if fl := p.freeLine[slot]; fl != 0 {
		return p.fail(lineNo, line, "id %d freed twice (first at line %d)", id, fl)
	}
	p.freeLine[slot] = uint32(lineNo)
	p.live -= p.sizes[slot]
	p.t.Events = append(p.t.Events, Event{Op: OpFree, Slot: slot, Line: uint32(lineNo)})
	return nil
}

// fields splits line at spaces and tabs (a trailing '\r' is ignored) into
// f and returns how many fields there are, which may exceed len(f).
func fields(line []byte, f [][]byte) int {
	n := 0
	for i := 0; i < len(line); {
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		if i == len(line) {
			break
		}
		j := i
		for j < len(line) && !isSpace(line[j]) {
			j++
		}
		if n < len(f) {
			f[n] = line[i:j]
		}
		n++
		i = j
	}
	return n
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

// parseUint parses a decimal unsigned integer without a sign, rejecting
// overflow.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}
