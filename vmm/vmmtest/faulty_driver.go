package vmmtest

import "github.com/xseg-dev/xseg/vmm"

// Op names an operation of the driver: a method of vmm.Driver (or of one of
// the optional interfaces Faulty forwards) that returns an error. Its value is
// the method's name. [AllOps] lists them all, derived from the interface.
type Op string

// The operations, one for each forwarding method below. A new driver method
// needs its forwarding method and its constant here, nothing else: the set of
// operations (AllOps, what Ops accepts, PerOp, chaining) is derived from the
// interface by reflection (faulty_where.go), and TestFaultyEveryOp checks
// that each method reports its own operation.
const (
	OpDriverVersion     Op = "DriverVersion"
	OpDeviceCount       Op = "DeviceCount"
	OpDeviceInfo        Op = "DeviceInfo"
	OpMemInfo           Op = "MemInfo"
	OpReserve           Op = "Reserve"
	OpUnreserve         Op = "Unreserve"
	OpCreate            Op = "Create"
	OpRelease           Op = "Release"
	OpMap               Op = "Map"
	OpUnmap             Op = "Unmap"
	OpSetAccess         Op = "SetAccess"
	OpGetAccess         Op = "GetAccess"
	OpExportFD          Op = "ExportFD"
	OpImportFD          Op = "ImportFD"
	OpExportFabric      Op = "ExportFabric"
	OpImportFabric      Op = "ImportFabric"
	OpStreamCreate      Op = "StreamCreate"
	OpStreamDestroy     Op = "StreamDestroy"
	OpStreamSynchronize Op = "StreamSynchronize"
	OpDeviceSynchronize Op = "DeviceSynchronize"
	OpEventCreate       Op = "EventCreate"
	OpEventRecord       Op = "EventRecord"
	OpEventQuery        Op = "EventQuery"
	OpEventSynchronize  Op = "EventSynchronize"
	OpEventDestroy      Op = "EventDestroy"
	OpCopyHtoD          Op = "CopyHtoD"
	OpCopyDtoH          Op = "CopyDtoH"
	OpCopyDtoD          Op = "CopyDtoD"
	OpMemset            Op = "Memset"
	OpMemsetAsync       Op = "MemsetAsync"
	OpMemAlloc          Op = "MemAlloc"
	OpMemFree           Op = "MemFree"
	OpExportAllocIPC    Op = "ExportAllocIPC"
	OpOpenAllocIPC      Op = "OpenAllocIPC"
	OpCloseAllocIPC     Op = "CloseAllocIPC"
	OpExportAllocFD     Op = "ExportAllocFD"
	OpClose             Op = "Close"
)

// The driver methods of Faulty: each counts its call (enter), fails it if an
// injector says so, and passes it on otherwise.

// Backend names the wrapped backend; it is never failed.
func (f *Faulty) Backend() string { return f.d.Backend() }

// Usage reports the wrapped driver's usage; it is never failed.
func (f *Faulty) Usage() vmm.Usage { return f.d.Usage() }

// DriverVersion implements vmm.Driver.
func (f *Faulty) DriverVersion() (int, error) {
	if err := f.enter(OpDriverVersion); err != nil {
		return 0, err
	}
	return f.d.DriverVersion()
}

// DeviceCount implements vmm.Driver.
func (f *Faulty) DeviceCount() (int, error) {
	if err := f.enter(OpDeviceCount); err != nil {
		return 0, err
	}
	return f.d.DeviceCount()
}

// DeviceInfo implements vmm.Driver.
func (f *Faulty) DeviceInfo(dev vmm.Device) (vmm.DeviceInfo, error) {
	if err := f.enter(OpDeviceInfo); err != nil {
		return vmm.DeviceInfo{}, err
	}
	return f.d.DeviceInfo(dev)
}

// MemInfo implements vmm.Driver.
func (f *Faulty) MemInfo(dev vmm.Device) (free, total uint64, err error) {
	if err := f.enter(OpMemInfo); err != nil {
		return 0, 0, err
	}
	return f.d.MemInfo(dev)
}

// Reserve implements vmm.Driver.
func (f *Faulty) Reserve(size, align uint64) (vmm.DevicePtr, error) {
	if err := f.enter(OpReserve); err != nil {
		return 0, err
	}
	return f.d.Reserve(size, align)
}

// Unreserve implements vmm.Driver.
func (f *Faulty) Unreserve(ptr vmm.DevicePtr, size uint64) error {
	if err := f.enter(OpUnreserve); err != nil {
		return err
	}
	return f.d.Unreserve(ptr, size)
}

// Create implements vmm.Driver.
func (f *Faulty) Create(dev vmm.Device, size uint64, types vmm.HandleType) (vmm.Handle, error) {
	if err := f.enter(OpCreate); err != nil {
		return 0, err
	}
	return f.d.Create(dev, size, types)
}

// Release implements vmm.Driver.
func (f *Faulty) Release(h vmm.Handle) error {
	if err := f.enter(OpRelease); err != nil {
		return err
	}
	return f.d.Release(h)
}

// Map implements vmm.Driver.
func (f *Faulty) Map(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) error {
	if err := f.enter(OpMap); err != nil {
		return err
	}
	return f.d.Map(ptr, size, h, offset)
}

// Unmap implements vmm.Driver.
func (f *Faulty) Unmap(ptr vmm.DevicePtr, size uint64) error {
	if err := f.enter(OpUnmap); err != nil {
		return err
	}
	return f.d.Unmap(ptr, size)
}

// SetAccess implements vmm.Driver.
func (f *Faulty) SetAccess(ptr vmm.DevicePtr, size uint64, access []vmm.AccessDesc) error {
	if err := f.enter(OpSetAccess); err != nil {
		return err
	}
	return f.d.SetAccess(ptr, size, access)
}

// GetAccess implements vmm.Driver.
func (f *Faulty) GetAccess(ptr vmm.DevicePtr, dev vmm.Device) (vmm.Access, error) {
	if err := f.enter(OpGetAccess); err != nil {
		return vmm.AccessNone, err
	}
	return f.d.GetAccess(ptr, dev)
}

// ExportFD implements vmm.Driver.
func (f *Faulty) ExportFD(h vmm.Handle) (int, error) {
	if err := f.enter(OpExportFD); err != nil {
		return -1, err
	}
	return f.d.ExportFD(h)
}

// ImportFD implements vmm.Driver.
func (f *Faulty) ImportFD(fd int) (vmm.Handle, error) {
	if err := f.enter(OpImportFD); err != nil {
		return 0, err
	}
	return f.d.ImportFD(fd)
}

// ExportFabric implements vmm.Driver.
func (f *Faulty) ExportFabric(h vmm.Handle) (vmm.FabricHandle, error) {
	if err := f.enter(OpExportFabric); err != nil {
		return vmm.FabricHandle{}, err
	}
	return f.d.ExportFabric(h)
}

// ImportFabric implements vmm.Driver.
func (f *Faulty) ImportFabric(fh vmm.FabricHandle) (vmm.Handle, error) {
	if err := f.enter(OpImportFabric); err != nil {
		return 0, err
	}
	return f.d.ImportFabric(fh)
}

// StreamCreate implements vmm.Driver.
func (f *Faulty) StreamCreate(dev vmm.Device) (vmm.Stream, error) {
	if err := f.enter(OpStreamCreate); err != nil {
		return 0, err
	}
	return f.d.StreamCreate(dev)
}

// StreamDestroy implements vmm.Driver.
func (f *Faulty) StreamDestroy(s vmm.Stream) error {
	if err := f.enter(OpStreamDestroy); err != nil {
		return err
	}
	return f.d.StreamDestroy(s)
}

// StreamSynchronize implements vmm.Driver.
func (f *Faulty) StreamSynchronize(s vmm.Stream) error {
	if err := f.enter(OpStreamSynchronize); err != nil {
		return err
	}
	return f.d.StreamSynchronize(s)
}

// DeviceSynchronize implements vmm.Driver.
func (f *Faulty) DeviceSynchronize(dev vmm.Device) error {
	if err := f.enter(OpDeviceSynchronize); err != nil {
		return err
	}
	return f.d.DeviceSynchronize(dev)
}

// EventCreate implements vmm.Driver.
func (f *Faulty) EventCreate(dev vmm.Device) (vmm.Event, error) {
	if err := f.enter(OpEventCreate); err != nil {
		return 0, err
	}
	return f.d.EventCreate(dev)
}

// EventRecord implements vmm.Driver.
func (f *Faulty) EventRecord(e vmm.Event, s vmm.Stream) error {
	if err := f.enter(OpEventRecord); err != nil {
		return err
	}
	return f.d.EventRecord(e, s)
}

// EventQuery implements vmm.Driver.
func (f *Faulty) EventQuery(e vmm.Event) (bool, error) {
	if err := f.enter(OpEventQuery); err != nil {
		return false, err
	}
	return f.d.EventQuery(e)
}

// EventSynchronize implements vmm.Driver.
func (f *Faulty) EventSynchronize(e vmm.Event) error {
	if err := f.enter(OpEventSynchronize); err != nil {
		return err
	}
	return f.d.EventSynchronize(e)
}

// EventDestroy implements vmm.Driver.
func (f *Faulty) EventDestroy(e vmm.Event) error {
	if err := f.enter(OpEventDestroy); err != nil {
		return err
	}
	return f.d.EventDestroy(e)
}

// CopyHtoD implements vmm.Driver.
func (f *Faulty) CopyHtoD(dst vmm.DevicePtr, src []byte) error {
	if err := f.enter(OpCopyHtoD); err != nil {
		return err
	}
	return f.d.CopyHtoD(dst, src)
}

// CopyDtoH implements vmm.Driver.
func (f *Faulty) CopyDtoH(dst []byte, src vmm.DevicePtr) error {
	if err := f.enter(OpCopyDtoH); err != nil {
		return err
	}
	return f.d.CopyDtoH(dst, src)
}

// CopyDtoD implements vmm.Driver.
func (f *Faulty) CopyDtoD(dst, src vmm.DevicePtr, n uint64) error {
	if err := f.enter(OpCopyDtoD); err != nil {
		return err
	}
	return f.d.CopyDtoD(dst, src, n)
}

// Memset implements vmm.Driver.
func (f *Faulty) Memset(dst vmm.DevicePtr, value byte, n uint64) error {
	if err := f.enter(OpMemset); err != nil {
		return err
	}
	return f.d.Memset(dst, value, n)
}

// MemsetAsync implements vmm.AsyncMemsetter: it forwards to the wrapped
// driver's, or answers vmm.ErrNotSupported if that has none.
func (f *Faulty) MemsetAsync(dst vmm.DevicePtr, value byte, n uint64, s vmm.Stream) error {
	if err := f.enter(OpMemsetAsync); err != nil {
		return err
	}
	return MemsetAsync(f.d, dst, value, n, s)
}

// MemAlloc implements vmm.Driver.
func (f *Faulty) MemAlloc(dev vmm.Device, size uint64) (vmm.DevicePtr, error) {
	if err := f.enter(OpMemAlloc); err != nil {
		return 0, err
	}
	return f.d.MemAlloc(dev, size)
}

// MemFree implements vmm.Driver.
func (f *Faulty) MemFree(ptr vmm.DevicePtr) error {
	if err := f.enter(OpMemFree); err != nil {
		return err
	}
	return f.d.MemFree(ptr)
}

// ExportAllocIPC implements vmm.AllocIPC: it forwards to the wrapped
// driver's, or answers vmm.ErrNotSupported if that has none.
func (f *Faulty) ExportAllocIPC(ptr vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	if err := f.enter(OpExportAllocIPC); err != nil {
		return vmm.IPCMemHandle{}, err
	}
	return exportAllocIPC(f.d, ptr)
}

// OpenAllocIPC implements vmm.AllocIPC, as ExportAllocIPC does.
func (f *Faulty) OpenAllocIPC(h vmm.IPCMemHandle, dev vmm.Device) (vmm.DevicePtr, uint64, error) {
	if err := f.enter(OpOpenAllocIPC); err != nil {
		return 0, 0, err
	}
	return openAllocIPC(f.d, h, dev)
}

// CloseAllocIPC implements vmm.AllocIPC, as ExportAllocIPC does.
func (f *Faulty) CloseAllocIPC(ptr vmm.DevicePtr) error {
	if err := f.enter(OpCloseAllocIPC); err != nil {
		return err
	}
	return closeAllocIPC(f.d, ptr)
}

// ExportAllocFD implements vmm.AllocFD: it forwards to the wrapped driver's,
// or answers vmm.ErrNotSupported if that has none.
func (f *Faulty) ExportAllocFD(ptr vmm.DevicePtr) (int, uint64, error) {
	if err := f.enter(OpExportAllocFD); err != nil {
		return -1, 0, err
	}
	return exportAllocFD(f.d, ptr)
}

// Close implements vmm.Driver. An injected failure leaves the wrapped driver
// open.
func (f *Faulty) Close() error {
	if err := f.enter(OpClose); err != nil {
		return err
	}
	return f.d.Close()
}
