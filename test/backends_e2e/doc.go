// Package backends_e2e runs the driver's stage machine, for real, over
// every sandbox backend: local (the control), opensandbox (through the
// fake OpenSandbox of internal/fake/execd), docker and kubectl (through
// the fake clients of internal/fake/cli, first on PATH). It is built on
// internal/drivertest, the driver's own test world: each scenario runs in
// a drivertest.Env on the backend it names (drivertest.NewOn), with the
// real driver.Runner and Participant in process, the fake adapter, the
// real static ngsup uploaded through the backend, and an owner
// (pkg/driver/owner/lending) with an ngsup of its own lending the
// backend's sandboxes through its own create, snapshot, fork and remove.
// Tests stop every launch they started and fail if anything is left
// running in a sandbox. They need root (mount namespaces).
package backends_e2e
