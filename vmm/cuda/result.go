package cuda

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Result is a CUresult, a status code of the CUDA driver API, as an error.
// Only failures are turned into Results: success is a nil error.
//
// Its text is the driver's name and description of the code
// ("CUDA_ERROR_OUT_OF_MEMORY: out of memory"), taken from the driver once
// libcuda is loaded and from a built-in table before that. Through Is it
// matches the vmm sentinels (errors.Is(err, vmm.ErrOutOfMemory)), while
// errors.As(err, &r) gives back the code itself.
type Result int

// The codes this package looks at. The values are those of cuda.h.
const (
	ErrorInvalidValue      Result = 1
	ErrorOutOfMemory       Result = 2
	ErrorNotInitialized    Result = 3
	ErrorDeinitialized     Result = 4
	ErrorStubLibrary       Result = 34
	ErrorDeviceUnavailable Result = 46
	ErrorNoDevice          Result = 100
	ErrorInvalidDevice     Result = 101
	ErrorInvalidContext    Result = 201
	ErrorInvalidHandle     Result = 400
	ErrorNotFound          Result = 500
	ErrorNotReady          Result = 600
	ErrorIllegalAddress    Result = 700
	ErrorContextDestroyed  Result = 709
	ErrorNotPermitted      Result = 800
	ErrorNotSupported      Result = 801
	ErrorSystemNotReady    Result = 802
	ErrorDriverMismatch    Result = 803
	ErrorCompatNotOnDevice Result = 804
	ErrorUnknown           Result = 999
)

// builtinText names the codes a caller of this package may meet, for use
// before the driver is loaded (or when it does not know a code).
var builtinText = map[Result][2]string{
	ErrorInvalidValue:      {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	ErrorOutOfMemory:       {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	ErrorNotInitialized:    {"CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	ErrorDeinitialized:     {"CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	ErrorStubLibrary:       {"CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
	ErrorDeviceUnavailable: {"CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable"},
	ErrorNoDevice:          {"CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	ErrorInvalidDevice:     {"CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	ErrorInvalidContext:    {"CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	ErrorInvalidHandle:     {"CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	ErrorNotFound:          {"CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	ErrorNotReady:          {"CUDA_ERROR_NOT_READY", "device not ready"},
	ErrorIllegalAddress:    {"CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	ErrorContextDestroyed:  {"CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
	ErrorNotPermitted:      {"CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	ErrorNotSupported:      {"CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	ErrorSystemNotReady:    {"CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized"},
	ErrorDriverMismatch:    {"CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "system has unsupported display driver / cuda driver combination"},
	ErrorCompatNotOnDevice: {"CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward compatibility was attempted on non supported HW"},
	ErrorUnknown:           {"CUDA_ERROR_UNKNOWN", "unknown error"},
}

// Name is the code's name in cuda.h, e.g. "CUDA_ERROR_OUT_OF_MEMORY".
func (r Result) Name() string {
	name, _ := r.describe()
	return name
}

func (r Result) Error() string {
	name, text := r.describe()
	return name + ": " + text
}

func (r Result) describe() (name, text string) {
	if name, text, ok := driverErrorText(r); ok {
		return name, text
	}
	if t, ok := builtinText[r]; ok {
		return t[0], t[1]
	}
	return fmt.Sprintf("CUresult(%d)", int(r)), "unrecognised CUDA error"
}

// Is matches the vmm sentinel errors:
//
//	CUDA_ERROR_OUT_OF_MEMORY                         vmm.ErrOutOfMemory
//	CUDA_ERROR_INVALID_VALUE, _INVALID_HANDLE,
//	  _INVALID_DEVICE                                vmm.ErrInvalid
//	CUDA_ERROR_NOT_SUPPORTED, _NOT_PERMITTED,
//	  _NO_DEVICE, _STUB_LIBRARY,
//	  _SYSTEM_DRIVER_MISMATCH, _COMPAT_NOT_SUPPORTED_ON_DEVICE
//	                                                 vmm.ErrNotSupported
//	CUDA_ERROR_DEINITIALIZED                         vmm.ErrClosed
//
// NOT_PERMITTED counts as not supported: the driver answers it where the
// system forbids a kind of sharing (a fabric handle without an IMEX
// channel), which a caller handles exactly like a missing capability.
func (r Result) Is(target error) bool {
	switch target {
	case vmm.ErrOutOfMemory:
		return r == ErrorOutOfMemory
	case vmm.ErrInvalid:
		return r == ErrorInvalidValue || r == ErrorInvalidHandle || r == ErrorInvalidDevice
	case vmm.ErrNotSupported:
		switch r {
		case ErrorNotSupported, ErrorNotPermitted, ErrorNoDevice, ErrorStubLibrary,
			ErrorDriverMismatch, ErrorCompatNotOnDevice:
			return true
		}
	case vmm.ErrClosed:
		return r == ErrorDeinitialized
	}
	return false
}
