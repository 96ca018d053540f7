//go:build cgo && linux && xsegtiming

package cuda

// Built with -tags xsegtiming, every trampoline also adds the nanoseconds
// spent in the driver call, and in the whole trampoline (context check
// included), to its symbol table (see XS_IN_CTX), so that the benchmarks
// can tell the driver's time on the Go path from the Go layer's. The other
// builds compile no clock reads into the trampolines.

// #cgo CFLAGS: -DXS_TIMING
import "C"
