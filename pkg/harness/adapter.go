package harness

import (
	"context"
	"encoding/json"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// LentSandbox is the sandbox the owner lent the run, connected.
type LentSandbox struct {
	sandbox.Sandbox
	// Descriptor is what /sandbox_access named.
	Descriptor sandbox.Descriptor
}

// Unwrap returns the connected sandbox (sandbox.Unwrapper), so the
// capabilities of the backend's sandbox (sandbox.AsHostBatcher) are found
// through a LentSandbox.
func (l LentSandbox) Unwrap() sandbox.Sandbox { return l.Sandbox }

// Decision is an adapter's answer on continuing a saved session.
type Decision struct {
	// Resume: continue the saved session; otherwise start over in a fresh
	// state (State).
	Resume bool
	// Reason is recorded in the launch record.
	Reason string
	// State replaces the adapter's state when starting over (a fresh
	// folder); nil keeps it.
	State json.RawMessage
}

// LaunchSpec is the harness command an adapter wants run under ngsup: what
// Adapter.Launch returns, and what the driver's launcher (pkg/driver/launch)
// starts.
type LaunchSpec struct {
	// Argv is the command; Env is added to its environment; Dir is its
	// working folder (the sandbox's workdir when empty).
	Argv []string
	Env  map[string]string
	Dir  string
	// Timeout bounds the harness's running time (paused time not counted);
	// 0 for none.
	Timeout time.Duration
	// Stdin, when set, is a file inside the sandbox (absolute) the harness
	// reads as its stdin; otherwise its stdin is /dev/null.
	Stdin string
}

// LaunchContext is what an adapter gets for one launch.
type LaunchContext struct {
	// RolloutID and Attempt identify the run.
	RolloutID string
	Attempt   int
	// Input is the run body (the task).
	Input json.RawMessage
	// Sandbox is the lent sandbox.
	Sandbox LentSandbox
	// State is the adapter's state (after the resume decision).
	State json.RawMessage
	// Resume says this launch continues a saved session.
	Resume bool
	// LaunchID and LaunchDir name the launch inside the sandbox.
	LaunchID, LaunchDir string
}

// HarnessResult is the outcome of a finished harness, handed to
// Adapter.Response.
type HarnessResult struct {
	// ExitCode is the harness's exit code.
	ExitCode int
	// Stdout and Stderr are (the tails of) its output.
	Stdout, Stderr []byte
}

// Adapter is everything harness-specific. The driver never knows which
// harness it runs.
type Adapter interface {
	// Name names the adapter in logs and config.
	Name() string
	// NewState returns where the harness keeps its session for a new run:
	// opaque JSON the driver stores in the harness bookmark.
	NewState(rolloutID string, attempt int, sb LentSandbox) (json.RawMessage, error)
	// ResumeDecision says whether the saved session in state can be
	// continued in sb; if not, it returns a fresh state.
	ResumeDecision(ctx context.Context, sb LentSandbox, state json.RawMessage, rolloutID string, attempt int) (Decision, error)
	// Launch prepares the sandbox (uploads, config) and returns the command.
	Launch(ctx context.Context, lc LaunchContext) (LaunchSpec, error)
	// Response collects what verify needs from a finished harness (the final
	// response, the session export): JSON placed under "response".
	Response(ctx context.Context, sb LentSandbox, state json.RawMessage, res HarnessResult) (json.RawMessage, error)
}

// GymResulter is optional: an adapter whose harness response maps onto
// NeMo Gym's /run reply. GymResult turns the stored response (what Response
// returned) and the run body into the `response` that verify and the reply
// carry (a NeMoGymResponse) and the adapter's own fields set beside it
// (OpenCode's opencode_*). Without it the stored response goes as it is. An
// error fails the run: a reply that is not what the trainer reads must not
// be handed on as if it were.
type GymResulter interface {
	GymResult(response, body json.RawMessage) (json.RawMessage, map[string]json.RawMessage, error)
}

// PausesAtCheckpoints is the optional opt-in of an adapter whose harness can
// be paused in place at a checkpoint (SIGSTOP, then SIGCONT to the same
// processes). Without it, or when it returns false, a checkpoint stops the
// launch and the run relaunches after it.
type PausesAtCheckpoints interface {
	PausesAtCheckpoints() bool
}
