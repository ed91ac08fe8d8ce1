package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// Outcome says how a launch ended.
type Outcome string

// Launch outcomes.
const (
	// OutcomeFinished: the harness exited 0.
	OutcomeFinished Outcome = "finished"
	// OutcomeInterrupted: a checkpoint, a stop or a crash ended or held it.
	OutcomeInterrupted Outcome = "interrupted"
	// OutcomeFailed: the harness exited non-zero, or could not be launched.
	OutcomeFailed Outcome = "failed"
	// OutcomeRunning: still running (only in a bookmark taken while paused).
	OutcomeRunning Outcome = "running"
)

// LaunchRecord is one launch of a run, as ng_harness_launches reports it.
type LaunchRecord struct {
	// ID is the launch id (ngsup's --id).
	ID string `json:"id"`
	// SandboxID is the sandbox it ran in.
	SandboxID string `json:"sandbox_id"`
	// Resumed says it continued a saved session; Reason says why or why not.
	Resumed bool   `json:"resumed"`
	Reason  string `json:"reason"`
	// DurationS is how long it ran (paused time included), in seconds.
	DurationS float64 `json:"duration_s"`
	// Outcome is how it ended.
	Outcome Outcome `json:"outcome"`
	// ExitCode is the harness's exit code (-1 unknown).
	ExitCode int `json:"exit_code"`
	// Pauses counts the checkpoints that paused it in place.
	Pauses int `json:"pauses"`
	// PausedS is how long it was held paused in all, in seconds: summed
	// over its pauses, each from the pause confirmed to the continue (or
	// the stop that ended it) returned, as the driver measures it. A
	// signal-level pause cannot stop the harness's own clocks, so its
	// timers (a tool's timeout) count this time too. A launch that a crash
	// took is reported as the checkpoint that paused it exported it: its
	// paused_s counts the pauses before that one.
	PausedS float64 `json:"paused_s"`
	// Supervised says ngsup supervised it (else it ran tagged only).
	Supervised bool `json:"supervised"`
	// Error is why it failed or was interrupted, when known.
	Error string `json:"error,omitempty"`
	// StartedAt is when it was launched.
	StartedAt time.Time `json:"started_at"`
}

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

// LaunchSpec is the harness command an adapter wants run under ngsup
// (launch.Spec). It is named here because it is what Adapter.Launch
// returns: an adapter needs only this package.
type LaunchSpec = launch.Spec

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

// Outcome of a finished harness, handed to Verify.
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

// StateDir is a new folder for one attempt's harness state (its HOME, its
// session files) under the sandbox's ngharness root, so the sandbox's
// snapshot carries it: <root>/state/<adapter>/<rollout>-a<attempt>-<ns>,
// the rollout id with every character outside [A-Za-z0-9_-] made '_'. The
// nanosecond suffix keeps a relaunch that starts over apart from the
// folder it left.
func StateDir(sb LentSandbox, adapter, rollout string, attempt int) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, rollout)
	return path.Join(sb.Root(), "state", adapter, fmt.Sprintf("%s-a%d-%d", clean, attempt, time.Now().UnixNano()))
}

// TaskText reads a harness's task from a run body: "task", else the last
// user input of responses_create_params (a string, or a message whose
// content is a string or text parts, joined by newlines). Every adapter
// that gives its harness one prompt reads it this way.
func TaskText(body json.RawMessage) (string, error) {
	var b struct {
		Task   *string `json:"task"`
		Params struct {
			Input json.RawMessage `json:"input"`
		} `json:"responses_create_params"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", fmt.Errorf("read the task: %w", err)
	}
	if b.Task != nil && *b.Task != "" {
		return *b.Task, nil
	}
	var s string
	if json.Unmarshal(b.Params.Input, &s) == nil && s != "" {
		return s, nil
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(b.Params.Input, &msgs) == nil {
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].Role != "user" {
				continue
			}
			if json.Unmarshal(msgs[i].Content, &s) == nil && s != "" {
				return s, nil
			}
			var parts []struct {
				Text string `json:"text"`
			}
			if json.Unmarshal(msgs[i].Content, &parts) == nil {
				var t []string
				for _, p := range parts {
					t = append(t, p.Text)
				}
				if j := strings.Join(t, "\n"); j != "" {
					return j, nil
				}
			}
		}
	}
	return "", errors.New("the run body has no task (a \"task\" string or responses_create_params.input)")
}
