// Package drivertest is the one in-process world of the driver's tests
// (pkg/driver), of test/backends_e2e and of the real harnesses' World
// (internal/harnesstest, through NewWith): a real static ngsup built once
// per test binary, a real local sandbox backend in the test's temporary
// folder (a mount namespace per exec, as root), the backend a test runs
// on, a real lending owner with an ngsup of its own (as the owner's
// process has), the fake adapter, and driver.Runner with
// driver.Participant wired as `ngdriver run` wires them.
//
// New runs on the backend DRIVERTEST_BACKEND names (BackendEnv), NewOn on
// the one a test names: local, the fake OpenSandbox (internal/fake/execd),
// the fake docker or kubectl (internal/fake/cli), a real Docker engine, or
// a real OpenSandbox server. The fakes keep their sandboxes in the local
// backend's folder, so a test looks at a sandbox's files and processes on
// the host whatever the backend; DeleteSandbox deletes one behind the
// owner's back through its service.
//
// Around the real parts it adds only observation and, where a test asks,
// interception: a backend that records every exec's argv and every upload
// (and lets a test hold, fail or answer an exec), an owner that counts its
// calls per rollout, and helpers that look at a sandbox's processes
// (through internal/proctest, the tests' one /proc reader) and the fake
// harness's session files.
//
// Every Env stops what its tests started: at cleanup it cancels the runs
// still going, runs `ngsup stop --id` on every launch folder of every
// sandbox it holds, and fails the test if any process is still running in
// one of its sandboxes (found by the bind mount of the sandbox's folder in
// /proc/PID/mountinfo, or by the launch tag of one of its rollouts); those
// are then killed by pidfd, each one identified first. It then removes
// what a real OpenSandbox server holds of the test, and the empty cgroups
// of its launches.
package drivertest

// The driver's and the owner's log of a test is printed when the test
// fails; DRIVERTEST_VERBOSE=1 also streams it to stderr as it happens.
