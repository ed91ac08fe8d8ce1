package launch

import (
	"context"
	"errors"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Sentinel errors of launch control. A failure wraps one of them with %w
// and a verb phrase naming what was run in which sandbox ("ngsup pause in
// sb-1: printed nothing ..."); callers tell the classes apart with
// errors.Is, never by the text.
var (
	// ErrLaunch: ngsup could not launch or follow the harness.
	ErrLaunch = errors.New("launch failed")
	// ErrNoNgsup: no build of ngsup (or of another tool) is configured for
	// the sandbox's architecture.
	ErrNoNgsup = errors.New("no ngsup binary for this architecture")
	// ErrNoSupervisor: ngsup could not start as the launch's supervisor,
	// and the sandbox is still there: nothing of the launch runs, and it
	// may be launched tagged only instead. It comes with ErrLaunch.
	ErrNoSupervisor = errors.New("ngsup could not supervise the launch")
	// ErrNoReceipt: a launch that runs tagged only keeps no receipt.
	ErrNoReceipt = errors.New("a launch that runs tagged only has no receipt")
	// ErrNotConfirmed: ngsup ran and could not confirm what it was asked
	// (exit code 4): a pause that is not confirmed (the caller falls back
	// to stop), a continue that left something stopped, a stop that left
	// survivors.
	ErrNotConfirmed = errors.New("not confirmed")
	// ErrNoOutput: a verb printed nothing where its contract promises one
	// line of JSON (a pause that did is run once more).
	ErrNoOutput = errors.New("printed nothing")
	// ErrBadOutput: a verb printed something that is not one line of JSON
	// (an exec whose output was cut under load); a verb that is safe to
	// send again is sent again.
	ErrBadOutput = errors.New("printed what is not one line of JSON")
	// ErrBusy: a binary could not be run because it was still open for
	// writing (ETXTBSY, exit code 126): a file just uploaded can stay open
	// in a process forked at that moment until that process execs. Tried
	// again.
	ErrBusy = errors.New("binary busy")
)

// transient reports an error worth another try of a command that is safe
// to repeat: the request may not have reached the sandbox
// (sandbox.ErrTransport), ran out of time in a loaded sandbox
// (sandbox.ErrTimeout), the sandbox could not set the command up
// (sandbox.ErrSetup), or the binary was busy (ErrBusy). A sandbox that is
// gone, or a call that was cancelled, is never tried again.
func transient(err error) bool {
	switch {
	case err == nil, errors.Is(err, sandbox.ErrGone), errors.Is(err, context.Canceled):
		return false
	}
	return errors.Is(err, sandbox.ErrTransport) || errors.Is(err, sandbox.ErrTimeout) ||
		errors.Is(err, sandbox.ErrSetup) || errors.Is(err, ErrBusy)
}

// resend reports an error after which a verb that is safe to send again
// is sent again: a transient one, or an answer that came back cut.
func resend(err error) bool {
	return transient(err) || errors.Is(err, ErrBadOutput)
}
