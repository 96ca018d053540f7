// Package layering holds only a test, which keeps the module's layers
// apart: cgo only in vmm/cuda and cmd/libxseg (STYLE.md, habit 1), and the
// import arrows of docs/DESIGN.md's layer diagram that are cheap to check (vmm
// imports nothing of the module; vmm/host and vmm/cuda import only vmm and
// vmm/internal; nothing under vmm imports a layer above it; spec imports
// only vmm; the library imports nothing of cmd, bench or examples; and
// cmd, bench, examples and metrics import nothing under internal: they
// use the public API, as any program would). It reads every Go file of
// the module, whatever its build constraints, with go/parser.
package layering
