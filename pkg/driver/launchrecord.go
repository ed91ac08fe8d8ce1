package driver

import "time"

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
