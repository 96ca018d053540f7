// Package trace reads allocation traces and replays them through an
// allocator, measuring memory and speed.
//
// # Format
//
// A trace is text, usually gzip-compressed, one event a line:
//
//	a <id> <bytes> <stream>   allocate <bytes> on <stream> and call it <id>
//	f <id>                    free the block called <id>
//
// Ids are unsigned integers, unique within a trace: an id is allocated once
// and freed at most once, after its allocation. Streams are small unsigned
// integers; 0 is the device's default stream. Blank lines are ignored.
// Blocks still live at the end of a trace were live when recording stopped.
//
// # Parsing
//
// [Parse] and [ReadFile] read a whole trace and check it before anything is
// replayed, so a bad trace fails with a [*SyntaxError] naming the line and
// (the first bytes of) its text (a read error, such as gzip data cut
// short, names the line it stopped at), and a replay spends its time on the
// allocator only: ids become dense slot numbers and streams indexes into
// [Trace.Streams]. They stream the input: memory grows with the events, not
// with the bytes read, and a line may be at most [MaxLineLen] bytes long.
//
// # Replay
//
// [Replay] drives an [Allocator] with the events of a trace in order and
// reports a [Result]: the trace's peak of live bytes, the allocator's peak of
// reserved bytes and their ratio, nanoseconds per event, and the allocator's
// map, unmap, retry and out-of-memory counts. [OpenStreams] makes the driver
// streams a trace uses.
//
// # Variants
//
// [Perturb] derives a variant of a trace from a seed ([Perturbation]): a
// long-lived block allocated first, so every address moves, and every
// distinct size raised by a few percent, equal sizes alike. A policy whose
// ratio holds only for the exact trace shows it on the variants;
// [SpreadOf] summarises their ratios. The same seed gives the same variant
// everywhere, so bench/traces/baseline.json can hold ratios by seed.
//
// A Trace is immutable once parsed and may be replayed by several goroutines
// at once; everything else here is for one goroutine at a time.
package trace
