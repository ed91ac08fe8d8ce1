// Package reaper is ngsup's process logic inside the sandbox: it runs the
// harness as a child subreaper, finds every process of a launch, and pauses,
// continues and stops them with confirmation.
//
// A process is always identified by its pid and its start time (clock ticks,
// field 22 of /proc/PID/stat); a pid whose start time changed is never
// signalled. Signals go through a pidfd opened before the identity check, so
// the check and the signal see the same process.
//
// A launch's state (missing, empty, pending, running, paused, orphaned,
// ended...) is derived in one place (state.go), and every verb does what the
// verb x state table (transitions.go, shown in docs/ngsup.md) says for it.
//
// Reading /proc goes through FS, which takes a root so the parsers can be
// tested on fixtures. reaper imports pkg/proto and never pkg/driver.
package reaper
