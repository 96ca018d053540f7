// Package vmmtest holds what every vmm backend is tested with: one
// conformance suite, a leak check, and a fault-injecting wrapper.
//
// # Conformance suite
//
// [Run] runs the suite against a backend described by a [Config]. Every
// subtest opens a fresh driver, registers [CheckLeaks] on it, and releases
// what it made in t.Cleanup, so a failing subtest does not cascade into the
// next one. The suite covers every method of vmm.Driver and its error cases,
// each asserted with errors.Is on the vmm sentinels. Sizes come from
// DeviceInfo.Granularity and stay within a few hundred MiB of real pages, so
// the same suite runs on the host backend in CI and on an 80 GiB GPU.
//
// With Config.CrossProcess the export/import test also runs the importer in
// a child process: the test binary re-executes itself with the environment
// variable XSEG_VMMTEST_CHILD set and the exported fd in ExtraFiles. The
// backend's TestMain must call [ChildMain] first so that the child runs its
// role instead of the tests:
//
//	func TestMain(m *testing.M) {
//		vmmtest.ChildMain(func() (vmm.Driver, error) { return host.Open(host.Options{}) })
//		os.Exit(m.Run())
//	}
//
// # Leak check
//
// [CheckLeaks] registers a cleanup that fails the test unless the driver's
// Usage is zero and every file descriptor opened since the call has been
// closed again (the model is cilium/ebpf's testmain fd trace).
//
// # Fault injection
//
// [Faulty] wraps any vmm.Driver and fails chosen calls without calling the
// wrapped driver, so the unwind paths of the allocators run without a GPU
// (the model is pebble's vfs/errorfs). What fails is given by injectors, each
// a [Where] (which operations, [Op]: Ops, AllOps, categories such as
// RangeOps) and a [When] (which of their calls: OnNth, EveryNth,
// WithProbability with a seed, After a duration, AfterFailureOf another
// operation, combined with And, Or, Not, Then, Times, Once, PerOp), composed
// freely:
//
//	f := vmmtest.NewFaulty(d, vmmtest.Injector{
//		Where: vmmtest.RangeOps().Or(vmmtest.PageOps()),
//		When:  vmmtest.WithProbability(0.05, seed),
//	})
//
// FailNth(op, n, err) is the shorthand for the commonest one, and
// FailNthThen chains the failure of an undo to it. The operations are
// derived from the driver interface, so a new driver method needs only its
// forwarding method (and its Op constant) in faulty_driver.go. [RunMatrix]
// fails every call of a path in turn, alone and followed by a failed undo.
package vmmtest
