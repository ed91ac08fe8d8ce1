package harness

import (
	"fmt"
	"time"
)

// CLIOptions are the options every adapter of a command-line harness
// takes. An adapter embeds them in its Options, so their keys sit in its
// config section beside its own (`claude: {claude: ..., model_url: ...,
// timeout: ...}`); the harness binary's key is the adapter's own
// (claude.claude, codex.codex, opencode.opencode), so it stays in the
// adapter's Options and is passed to Check.
type CLIOptions struct {
	// ModelURL is the model server's base URL. The adapter adds the
	// rollout prefix /ng-rollout/<id>-a<attempt> (RolloutSegment), so every
	// model call is attributed to its rollout attempt.
	ModelURL string `json:"model_url"`
	// Model is the served model's name ("policy" when empty); APIKey is
	// sent to it ("none" when empty).
	Model  string `json:"model"`
	APIKey string `json:"api_key"`
	// PauseAtCheckpoints: false restores stop and relaunch (default true).
	PauseAtCheckpoints *bool `json:"pause_at_checkpoints"`
	// Env is added to the harness's environment (after the adapter's own
	// variables, so it may override them).
	Env map[string]string `json:"env"`
	// Timeout bounds one launch's running time (paused time not counted),
	// a Go duration; empty for none.
	Timeout string `json:"timeout"`
}

// Check is the one check of the options of the adapter named adapter,
// whose harness binary (the section's key named adapter too) is binary:
// the binary set, model_url an http(s) URL with a host (CheckModelURL),
// every env name a variable name (CheckEnvNames) and timeout a Go duration
// (ParseTimeout), which it returns. It fills Model and APIKey when empty.
// Errors name the adapter and the key.
func (o *CLIOptions) Check(adapter, binary string) (time.Duration, error) {
	if binary == "" {
		return 0, fmt.Errorf("%s: the %s binary (%s.%s) is required", adapter, adapter, adapter, adapter)
	}
	if err := CheckModelURL(adapter, o.ModelURL); err != nil {
		return 0, err
	}
	if o.Model == "" {
		o.Model = "policy"
	}
	if o.APIKey == "" {
		o.APIKey = "none"
	}
	if err := CheckEnvNames(adapter, o.Env); err != nil {
		return 0, err
	}
	return ParseTimeout(adapter, o.Timeout)
}

// Pauses is an adapter's PausesAtCheckpoints: true unless
// pause_at_checkpoints is false.
func (o CLIOptions) Pauses() bool {
	return o.PauseAtCheckpoints == nil || *o.PauseAtCheckpoints
}
