package handles

import (
	"encoding/hex"

	"github.com/xseg-dev/xseg/vmm"
)

// Fabric is the 64-byte exported form of a page created with
// vmm.HandleFabric. It is a plain value: it names the page, it does not own
// it, and it can be copied and sent anywhere (its bytes are the capability,
// so treat them as a secret). It converts to and from vmm.FabricHandle.
type Fabric [64]byte

// FabricOf returns the fabric handle of a driver's exported page.
func FabricOf(h vmm.FabricHandle) Fabric { return Fabric(h) }

// Driver returns f in the driver contract's type, for vmm.Driver.ImportFabric.
func (f Fabric) Driver() vmm.FabricHandle { return vmm.FabricHandle(f) }

// IsZero reports whether f is all zero bytes, which no driver exports.
func (f Fabric) IsZero() bool { return f == Fabric{} }

// String returns a short, non-secret form of f: its first 4 bytes in hex.
func (f Fabric) String() string { return "fabric:" + hex.EncodeToString(f[:4]) + "…" }

// IPCHandle is CUDA's 64-byte legacy IPC handle of a plain allocation
// (vmm.IPCMemHandle) as a descriptor carries it. Like Fabric it is a plain
// value whose bytes are the capability.
type IPCHandle [64]byte

// IsZero reports whether h is all zero bytes, which no driver exports.
func (h IPCHandle) IsZero() bool { return h == IPCHandle{} }

// String returns a short, non-secret form of h: its first 4 bytes in hex.
func (h IPCHandle) String() string { return "cuda-ipc:" + hex.EncodeToString(h[:4]) + "…" }
