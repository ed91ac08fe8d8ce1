// Package backends_e2e runs the driver's stage machine, for real, over
// every sandbox backend: local (the control), opensandbox (through the
// fake OpenSandbox of internal/fake/execd), docker and kubectl (through
// the fake clients of internal/fake/cli, first on PATH). Each scenario runs
// the real driver.Runner and Participant in process with the fake adapter, the real
// static ngsup uploaded through the backend, and an owner (pkg/driver/owner/lending)
// lending the backend's sandboxes through its own create, snapshot, fork
// and remove. Tests stop every launch they started and fail if anything is
// left running in a sandbox. They need root (mount namespaces).
package backends_e2e
