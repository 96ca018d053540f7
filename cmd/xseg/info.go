package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bytesize"
	"github.com/xseg-dev/xseg/vmm"
)

// probeStatus is a capability probe's answer (STYLE habit 4).
type probeStatus string

const (
	probeYes     probeStatus = "yes"
	probeNo      probeStatus = "no"
	probeUnknown probeStatus = "unknown"
)

// probeResult is a probe's answer and what it saw.
type probeResult struct {
	Status probeStatus `json:"status"`
	Detail string      `json:"detail"`
}

// infoReport is what `xseg info` says; its JSON form is `xseg info --json`.
type infoReport struct {
	Backend string `json:"backend"`
	// BackendReason says why this backend was chosen.
	BackendReason string `json:"backend_reason"`
	// DriverVersion is CUDA's encoding (1000*major + 10*minor); 0 for the
	// host backend.
	DriverVersion int            `json:"driver_version"`
	CUDA          cudaReport     `json:"cuda"`
	PidfdGetfd    probeResult    `json:"pidfd_getfd"`
	Devices       []deviceReport `json:"devices"`
}

// cudaReport says whether a CUDA driver could be opened, and if not, why.
type cudaReport struct {
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
}

// deviceReport describes one device of the chosen backend.
type deviceReport struct {
	Ordinal int `json:"ordinal"`
	// Simulated: the host backend's device, host memory that the
	// allocator treats as a GPU's; its name, uuid and memory are made up
	// (the memory is the configured capacity).
	Simulated              bool   `json:"simulated"`
	Name                   string `json:"name,omitempty"`
	UUID                   string `json:"uuid,omitempty"`
	TotalMemory            uint64 `json:"total_memory"`
	FreeMemory             uint64 `json:"free_memory"`
	VMM                    bool   `json:"vmm"`
	Granularity            uint64 `json:"granularity"`
	RecommendedGranularity uint64 `json:"recommended_granularity"`
	PosixFD                bool   `json:"posix_fd"`
	Fabric                 bool   `json:"fabric"`
	RDMAWithVMM            bool   `json:"rdma_with_vmm"`
	// Allocator is the allocator xseg.Open makes on this device with the
	// --allocator option (expandable or fallback), and AllocatorReason
	// why; AllocatorError says why it cannot make one.
	Allocator       xseg.AllocatorKind `json:"allocator,omitempty"`
	AllocatorReason string             `json:"allocator_reason,omitempty"`
	AllocatorError  string             `json:"allocator_error,omitempty"`
	Error           string             `json:"error,omitempty"`
}

func newInfoCmd(stdout io.Writer) *cobra.Command {
	asJSON := false
	var capacity capacityFlag
	backend := newEnum(xseg.BackendAuto, xseg.Backends()...)
	allocator := newEnum(xseg.AllocatorAuto, xseg.AllocatorKinds()...)
	cmd := &cobra.Command{
		Use:   "info",
		Short: "Report the backend, driver, devices and sharing capabilities of this machine",
		Long: `info opens the CUDA driver (or says why it cannot) and describes the backend
that xseg would use: driver version, and for each device its name, memory,
VMM support, page granularity, shareable handle kinds (POSIX fd, fabric) and
GPUDirect RDMA with VMM. It says which backend and, for each device, which
allocator xseg.Open would choose, and why: expandable where the device
supports VMM, fallback (plain allocations) where it does not, or the one
--allocator forces. It fails, as xseg.Open would, if the configuration in
the environment (XSEG_CONF, OOM_MAX_RETRIES, ...) does not parse. It also
probes whether pidfd_getfd is permitted for this process here (yes, no with
the errno, or unknown). The host backend's
devices are simulated: host memory of the configured capacity (--capacity,
default 141 GiB) that xseg treats as a GPU's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SilenceUsage = true
			// xseg.Open fails on a bad environment configuration; so does
			// info, rather than name the allocator Open would not make.
			if _, err := xseg.ConfigFromEnv(os.Getenv); err != nil {
				return err
			}
			rep, err := gatherInfo(backend.value, allocator.value, uint64(capacity))
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			return printInfo(stdout, rep)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	cmd.Flags().Var(backend, "backend", "backend to describe: auto (CUDA if it opens, else host), host or cuda")
	cmd.Flags().Var(&capacity, "capacity", capacityUsage)
	cmd.Flags().Var(allocator, "allocator", "allocator to choose: auto (expandable where the device supports VMM, else fallback), expandable or fallback")
	return cmd
}

// gatherInfo opens the backend and describes it, with the allocator
// xseg.Open would choose for each device.
func gatherInfo(backend xseg.Backend, allocator xseg.AllocatorKind, hostCapacity uint64) (*infoReport, error) {
	if hostCapacity != 0 && backend == xseg.BackendCUDA {
		return nil, errors.New("--capacity sets the host backend's memory; it does not apply to --backend cuda")
	}
	rep := &infoReport{PidfdGetfd: probePidfdGetfd(), Devices: []deviceReport{}}
	d, cudaErr := xseg.OpenDriver(xseg.BackendCUDA, 0)
	if cudaErr != nil {
		rep.CUDA.Reason = bare(cudaErr).Error()
		if backend == xseg.BackendCUDA {
			return nil, cudaErr
		}
	} else {
		rep.CUDA.Available = true
		if backend == xseg.BackendHost {
			if err := d.Close(); err != nil {
				return nil, fmt.Errorf("closing the CUDA driver: %w", err)
			}
			d = nil
		}
	}
	rep.BackendReason = backendReason(backend, rep.CUDA.Available)
	if d == nil {
		var err error
		if d, err = xseg.OpenDriver(xseg.BackendHost, hostCapacity); err != nil {
			return nil, err
		}
	}
	err := describe(d, rep, allocator)
	return rep, errors.Join(err, d.Close())
}

// describe fills rep with what d says about itself and its devices. A
// device that cannot be described carries its error in the report.
func describe(d vmm.Driver, rep *infoReport, allocator xseg.AllocatorKind) error {
	rep.Backend = d.Backend()
	v, err := d.DriverVersion()
	if err != nil {
		return fmt.Errorf("reading the driver version: %w", err)
	}
	rep.DriverVersion = v
	n, err := d.DeviceCount()
	if err != nil {
		return fmt.Errorf("counting devices: %w", err)
	}
	for i := range n {
		r := describeDevice(d, vmm.Device(i))
		if c, err := xseg.ChooseAllocator(d, vmm.Device(i), allocator); err != nil {
			r.AllocatorError = bare(err).Error()
		} else {
			r.Allocator, r.AllocatorReason = c.Allocator, c.Reason
		}
		rep.Devices = append(rep.Devices, r)
	}
	return nil
}

func describeDevice(d vmm.Driver, dev vmm.Device) deviceReport {
	r := deviceReport{Ordinal: int(dev), Simulated: d.Backend() == "host"}
	di, err := d.DeviceInfo(dev)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Name, r.UUID, r.TotalMemory = di.Name, di.UUIDString(), di.TotalMemory
	r.VMM, r.PosixFD, r.Fabric, r.RDMAWithVMM = di.VMM, di.PosixFD, di.Fabric, di.RDMAWithVMM
	r.Granularity, r.RecommendedGranularity = di.Granularity, di.RecommendedGranularity
	free, _, err := d.MemInfo(dev)
	if err != nil {
		r.Error = fmt.Sprintf("memory info: %v", err)
	}
	r.FreeMemory = free
	return r
}

// printInfo writes rep as aligned text.
func printInfo(w io.Writer, rep *infoReport) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	if rep.Backend == "host" {
		fmt.Fprintf(tw, "backend:\thost: simulated GPUs on host memory (%s)\n", rep.BackendReason)
	} else {
		fmt.Fprintf(tw, "backend:\t%s (%s)\n", rep.Backend, rep.BackendReason)
	}
	if rep.CUDA.Available {
		fmt.Fprintf(tw, "CUDA driver:\t%s\n", cudaVersion(rep.DriverVersion))
	} else {
		fmt.Fprintf(tw, "CUDA driver:\tnone here: %s\n", rep.CUDA.Reason)
	}
	fmt.Fprintf(tw, "pidfd_getfd:\t%s (%s)\n", rep.PidfdGetfd.Status, rep.PidfdGetfd.Detail)
	fmt.Fprintf(tw, "devices:\t%d\n", len(rep.Devices))
	for _, dv := range rep.Devices {
		printDevice(tw, dv)
		fmt.Fprintf(tw, "  shareable handles:\tposix-fd %s, fabric %s\n", yesNo(dv.PosixFD), yesNo(dv.Fabric))
		fmt.Fprintf(tw, "  GPUDirect RDMA with VMM:\t%s\n", yesNo(dv.RDMAWithVMM))
		if dv.AllocatorError != "" {
			fmt.Fprintf(tw, "  allocator:\tnone: %s\n", dv.AllocatorError)
		} else {
			fmt.Fprintf(tw, "  allocator:\t%s (%s)\n", dv.Allocator, dv.AllocatorReason)
		}
		if dv.Error != "" {
			fmt.Fprintf(tw, "  error:\t%s\n", dv.Error)
		}
	}
	return tw.Flush()
}

// printDevice writes the name, uuid, memory and VMM lines of a device,
// saying when it is the host backend's simulation.
func printDevice(tw io.Writer, dv deviceReport) {
	if dv.Simulated {
		fmt.Fprintf(tw, "device %d:\t%s: simulated GPU on host memory\n", dv.Ordinal, dv.Name)
		if dv.UUID != "" {
			fmt.Fprintf(tw, "  uuid:\t%s (made up by the host backend)\n", dv.UUID)
		}
		fmt.Fprintf(tw, "  memory:\t%s total (the host backend's configured capacity), %s free\n",
			bytesize.Format(dv.TotalMemory), bytesize.Format(dv.FreeMemory))
	} else {
		fmt.Fprintf(tw, "device %d:\t%s\n", dv.Ordinal, dv.Name)
		if dv.UUID != "" {
			fmt.Fprintf(tw, "  uuid:\t%s\n", dv.UUID)
		}
		fmt.Fprintf(tw, "  memory:\t%s total, %s free\n", bytesize.Format(dv.TotalMemory), bytesize.Format(dv.FreeMemory))
	}
	fmt.Fprintf(tw, "  vmm:\t%s, granularity %s (recommended %s)\n",
		yesNo(dv.VMM), bytesize.Format(dv.Granularity), bytesize.Format(dv.RecommendedGranularity))
}

// backendReason says why gatherInfo describes the backend it does.
func backendReason(asked xseg.Backend, cudaAvailable bool) string {
	switch {
	case asked != xseg.BackendAuto:
		return "asked for"
	case cudaAvailable:
		return "auto: a CUDA driver and device are here"
	}
	return "auto: no CUDA driver or device here, so the host backend"
}

func cudaVersion(v int) string { return fmt.Sprintf("%d.%d (%d)", v/1000, v%1000/10, v) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
