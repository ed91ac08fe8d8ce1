// Package drivertest is the test fixture of the driver's tests: a real
// static ngsup built once per test binary, a real local sandbox backend in
// the test's temporary folder (a mount namespace per exec, as root), a real
// lending owner whose StopSandbox is ngsup's, the fake adapter, and
// driver.Runner with driver.Participant wired as `ngdriver run` wires them.
//
// Around the real parts it adds only observation and, where a test asks,
// interception: a backend that records every exec's argv (and lets a test
// hold, fail or answer an exec), an owner that counts its calls per rollout,
// and helpers that look at a sandbox's processes (through
// internal/proctest, the tests' one /proc reader) and the fake harness's
// session files.
//
// Every Env stops what its tests started: at cleanup it cancels the runs
// still going, runs `ngsup stop --id` on every launch folder of every
// sandbox it holds, and fails the test if any process is still running in
// one of its sandboxes (found by the bind mount of the sandbox's folder in
// /proc/PID/mountinfo, or by the launch tag of one of its rollouts); those
// are then killed by pidfd, each one identified first.
package drivertest

// The driver's and the owner's log of a test is printed when the test
// fails; DRIVERTEST_VERBOSE=1 also streams it to stderr as it happens.
