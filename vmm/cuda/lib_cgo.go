//go:build cgo && linux

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include "xseg_cuda.h"

#define XS_OFFSET(name, params) offsetof(xs_syms, name),
static const char *const xs_names[] = { XS_ENTRY_POINTS(XS_NAME) };
static const size_t xs_offsets[] = { XS_ENTRY_POINTS(XS_OFFSET) };

// xs_resolve fills s with every entry point of XS_ENTRY_POINTS, asking
// cuGetProcAddress (v2 if given, else v1) for the ABI of CUDA version
// `version`. It returns -1, or the index of the entry point it could not
// resolve with the driver's answer in *res and *status.
static int xs_resolve(xs_syms *s, void *v2, void *v1, int version, CUresult *res, int *status) {
	for (int i = 0; i < XS_NUM_ENTRY_POINTS; i++) {
		void *fn = NULL;
		*status = CU_GET_PROC_ADDRESS_SUCCESS;
		if (v2 != NULL)
			*res = ((xs_getproc_v2)v2)(xs_names[i], &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, status);
		else
			*res = ((xs_getproc_v1)v1)(xs_names[i], &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
		if (*res != CUDA_SUCCESS || *status != CU_GET_PROC_ADDRESS_SUCCESS || fn == NULL)
			return i;
		memcpy((char *)s + xs_offsets[i], &fn, sizeof fn);
	}
	return -1;
}

static const char *xs_name(int i) { return xs_names[i]; }
static CUresult xs_call_init(void *fn) { return ((xs_init_fn)fn)(0); }
static CUresult xs_call_version(void *fn, int *v) { return ((xs_version_fn)fn)(v); }
static CUresult xs_error_name(void *fn, CUresult r, const char **s) { return ((CUresult (*)(CUresult, const char **))fn)(r, s); }
static CUresult xs_error_string(void *fn, CUresult r, const char **s) { return ((CUresult (*)(CUresult, const char **))fn)(r, s); }
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/xseg-dev/xseg/vmm"
)

// Open loads the CUDA driver (libcuda.so.1) if this process has not yet,
// initialises it (cuInit(0), once per process), resolves the entry points
// and retains the primary context of device 0. Other devices' primary
// contexts are retained when first used, so that a process using one GPU of
// eight does not create a context on all of them.
//
// Without a driver, or without a device, the error matches
// vmm.ErrNotSupported and says why (dlopen's reason, the cuInit code).
func Open() (*Driver, error) {
	lib, err := loadCUDA()
	if err != nil {
		return nil, err
	}
	if lib.initErr != nil {
		return nil, lib.initErr
	}
	p, err := lib.resolve()
	if err != nil {
		return nil, err
	}
	return open(symtab{p}, lib.version)
}

// errUnopened is the error of a Driver that Open did not make.
var errUnopened = fmt.Errorf("vmm/cuda: the Driver was not made by Open: %w", vmm.ErrNotSupported)

// libraryName is the CUDA driver library, the one the NVIDIA driver installs.
const libraryName = "libcuda.so.1"

// apiVersion is the CUDA version whose ABI the entry points are asked for:
// 12.0, which gives the _v2 variants (cuMemGetInfo_v2, cuMemAlloc_v2,
// cuCtxPushCurrent_v2, cuDeviceGetUuid_v2, ...). An older driver is asked
// for its own version.
const apiVersion = 12000

// library is libcuda, opened once per process and never closed: unloading
// the CUDA driver under a live process is not safe.
type library struct {
	handle   unsafe.Pointer
	getProc2 unsafe.Pointer // cuGetProcAddress_v2 (CUDA 12+), or nil
	getProc1 unsafe.Pointer // cuGetProcAddress (CUDA 11.3+)
	version  int            // cuDriverGetVersion
	initFn   unsafe.Pointer // cuInit
	initErr  error          // what cuInit(0) answered
	errName  unsafe.Pointer // cuGetErrorName
	errText  unsafe.Pointer // cuGetErrorString
}

// libcuda is the process's libcuda, loaded by the first Open. loaded is set
// once it is usable for error texts.
var libcuda struct {
	once   sync.Once
	lib    *library
	err    error
	loaded atomic.Pointer[library]
}

// loadCUDA opens libcuda and calls cuInit(0), once per process; both
// outcomes are remembered.
func loadCUDA() (*library, error) {
	libcuda.once.Do(func() {
		libcuda.lib, libcuda.err = load(libraryName)
		if libcuda.err == nil {
			libcuda.loaded.Store(libcuda.lib)
			libcuda.lib.initErr = libcuda.lib.cuInit()
		}
	})
	return libcuda.lib, libcuda.err
}

// load opens the library called name and finds its loader entry points.
// dlopen and dlsym report through dlerror, a per-thread string, so the
// sequence runs on one locked OS thread.
func load(name string) (*library, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	h := C.dlopen(cname, C.RTLD_NOW|C.RTLD_LOCAL)
	if h == nil {
		return nil, fmt.Errorf("loading the CUDA driver: %w: %s", vmm.ErrNotSupported, dlerror())
	}
	l := &library{handle: h}
	l.getProc2 = dlsym(h, "cuGetProcAddress_v2")
	l.getProc1 = dlsym(h, "cuGetProcAddress")
	l.initFn = dlsym(h, "cuInit")
	versionFn := dlsym(h, "cuDriverGetVersion")
	l.errName = dlsym(h, "cuGetErrorName")
	l.errText = dlsym(h, "cuGetErrorString")
	if l.getProc1 == nil || l.initFn == nil || versionFn == nil || l.errName == nil || l.errText == nil {
		// Leave the handle open: it costs nothing and dlclose of a
		// half-understood driver library is not worth the risk.
		return nil, fmt.Errorf("loading the CUDA driver: %s lacks cuGetProcAddress, cuInit or cuDriverGetVersion (driver older than CUDA 11.3?): %w", name, vmm.ErrNotSupported)
	}
	var v C.int
	if r := C.xs_call_version(versionFn, &v); r != 0 {
		return nil, fmt.Errorf("cuDriverGetVersion: %w", Result(r))
	}
	l.version = int(v)
	return l, nil
}

// dlsym returns the address of symbol in h, or nil. The caller holds its
// OS thread locked.
func dlsym(h unsafe.Pointer, symbol string) unsafe.Pointer {
	cs := C.CString(symbol)
	defer C.free(unsafe.Pointer(cs))
	C.dlerror() // clear an earlier error
	return C.dlsym(h, cs)
}

// dlerror returns the pending dlopen/dlsym error of this thread.
func dlerror() string {
	s := C.dlerror()
	if s == nil {
		return "unknown dlopen error"
	}
	return C.GoString(s)
}

// cuInit calls cuInit(0). Its error matches vmm.ErrNotSupported where there
// is no usable device (CUDA_ERROR_NO_DEVICE, a stub library, ...).
func (l *library) cuInit() error {
	if r := C.xs_call_init(l.initFn); r != 0 {
		return fmt.Errorf("cuInit: %w", Result(r))
	}
	return nil
}

// resolve fills a new symbol table through cuGetProcAddress. The table is C
// memory, so that passing it to C costs no cgo pointer check.
func (l *library) resolve() (*C.xs_syms, error) {
	version := min(apiVersion, l.version)
	s := (*C.xs_syms)(C.calloc(1, C.sizeof_xs_syms))
	var r C.CUresult
	var status C.int
	if i := C.xs_resolve(s, l.getProc2, l.getProc1, C.int(version), &r, &status); i >= 0 {
		C.free(unsafe.Pointer(s))
		name := C.GoString(C.xs_name(i))
		if r != 0 {
			return nil, fmt.Errorf("cuGetProcAddress(%s, %d): %w", name, version, errors.Join(Result(r), vmm.ErrNotSupported))
		}
		return nil, fmt.Errorf("cuGetProcAddress(%s, %d): driver %d does not have it (query result %d): %w", name, version, l.version, int(status), vmm.ErrNotSupported)
	}
	return s, nil
}

// driverErrorText asks the loaded driver for the name and text of r.
func driverErrorText(r Result) (name, text string, ok bool) {
	l := libcuda.loaded.Load()
	if l == nil {
		return "", "", false
	}
	var n, t *C.char
	if C.xs_error_name(l.errName, C.CUresult(r), &n) != 0 || n == nil {
		return "", "", false
	}
	if C.xs_error_string(l.errText, C.CUresult(r), &t) != 0 || t == nil {
		return "", "", false
	}
	return C.GoString(n), C.GoString(t), true
}
