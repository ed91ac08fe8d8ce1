// Package codex puts the Codex CLI (@openai/codex) on the driver: where
// Codex keeps its session (a per-rollout CODEX_HOME in the sandbox's
// ngharness state folder, carried by the snapshot), how it is launched
// (`codex exec --json`, fully local, pointed at the rollout's model URL on
// the Responses API), the resume decision, and the NeMoGymResponse of the
// /run reply built from the saved session (gymresponse.go).
//
// Codex cannot continue a saved session without adding a user turn: `codex
// exec resume` always sends a new user message, after closing an
// interrupted tool call with a synthetic "aborted" output. So a relaunch
// after a crash starts over with the task in a fresh folder, and the
// launch record's reason says so (docs/codex.md); Options.ResumePrompt
// opts in to continuing with that added turn instead. Codex pauses in
// place at checkpoints by default.
package codex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/harness"
)

// Options configures the adapter (the `codex:` part of the config).
type Options struct {
	// Codex is the codex binary inside the sandbox (the native one of
	// @openai/codex-linux-<arch>, or the npm wrapper).
	Codex string `json:"codex"`
	// CLIOptions are the keys every CLI adapter takes. Here model_url is a
	// server speaking the Responses API below /v1, and api_key is sent as
	// a bearer token.
	harness.CLIOptions
	// ResumePrompt, when set, is an opt-in to continue a saved session that
	// could be continued with `codex exec resume`, which sends this text as
	// a user turn the task did not have (the launch record's reason says
	// so). Unset (the default), a relaunch always starts over.
	ResumePrompt *string `json:"resume_prompt"`
}

// Adapter is the Codex CLI adapter.
type Adapter struct {
	opt     Options
	timeout time.Duration
}

// New checks the options (CLIOptions.Check) and returns the adapter.
func New(opt Options) (*Adapter, error) {
	timeout, err := opt.Check("codex", opt.Codex)
	if err != nil {
		return nil, err
	}
	return &Adapter{opt: opt, timeout: timeout}, nil
}

// State is where Codex keeps one rollout attempt's session.
type State struct {
	// Home holds home/ (HOME) and codex/ (CODEX_HOME: config.toml and
	// sessions/YYYY/MM/DD/rollout-<ts>-<uuid>.jsonl).
	Home string `json:"home"`
}

// Name implements harness.Adapter.
func (a *Adapter) Name() string { return "codex" }

// PausesAtCheckpoints implements harness.PausesAtCheckpoints: on unless the
// config says pause_at_checkpoints: false.
func (a *Adapter) PausesAtCheckpoints() bool { return a.opt.Pauses() }

// NewState implements harness.Adapter.
func (a *Adapter) NewState(rollout string, attempt int, sb harness.LentSandbox) (json.RawMessage, error) {
	return json.Marshal(State{Home: harness.StateDir(sb, "codex", rollout, attempt)})
}

func parseState(raw json.RawMessage) (State, error) {
	home, err := harness.StateHome("codex", raw)
	return State{Home: home}, err
}

func (s State) codexHome() string { return path.Join(s.Home, "codex") }

// keyVar is the environment variable Codex reads the model server's key
// from (the provider's env_key).
const keyVar = "NGHARNESS_CODEX_API_KEY"

// providerName is the model provider config.toml defines.
const providerName = "ngharness"

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	// A JSON string is a valid TOML basic string but for \u escapes of
	// code points TOML also allows; strconv.Quote would write \x escapes,
	// which TOML does not have.
	data, _ := json.Marshal(s)
	return string(data)
}

// baseURL is the provider's base URL for a rollout attempt: the model URL,
// the rollout prefix, /v1.
func (a *Adapter) baseURL(rollout string, attempt int) string {
	return strings.TrimRight(a.opt.ModelURL, "/") + "/ng-rollout/" + harness.RolloutSegment(rollout, attempt) + "/v1"
}

// config is $CODEX_HOME/config.toml: the model provider at base on the
// Responses API, no approvals and no sandbox of Codex's own (the lent
// sandbox is the sandbox), no retries (a retry is a repeated model call),
// and every call home off: update checks, analytics, feedback, telemetry,
// plugin sync.
func (a *Adapter) config(base string) string {
	return `model = ` + tomlString(a.opt.Model) + `
model_provider = "` + providerName + `"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.` + providerName + `]
name = "ngharness"
base_url = ` + tomlString(base) + `
env_key = "` + keyVar + `"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false
`
}

// env is Codex's environment for a state: HOME and CODEX_HOME in the state
// folder, the key, and the options' additions.
func (a *Adapter) env(st State) map[string]string {
	env := map[string]string{
		"HOME":       path.Join(st.Home, "home"),
		"CODEX_HOME": st.codexHome(),
		keyVar:       a.opt.APIKey,
	}
	for k, v := range a.opt.Env {
		env[k] = v
	}
	return env
}

// flags are the flags of every `codex exec`: JSON events, no git check, no
// approvals and no sandbox of Codex's own (the lent sandbox is the
// sandbox).
var flags = []string{"--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"}

// Launch implements harness.Adapter: config.toml is written into the
// state's CODEX_HOME (pointing at this attempt's model URL), then `codex
// exec --json --skip-git-repo-check
// --dangerously-bypass-approvals-and-sandbox -- TASK`, the task one argv
// element (never shell text), stdin /dev/null (ngsup's). A resume (only
// with ResumePrompt set) runs `codex exec resume ... -- ID PROMPT` on the
// saved session instead.
func (a *Adapter) Launch(ctx context.Context, lc harness.LaunchContext) (harness.LaunchSpec, error) {
	st, err := parseState(lc.State)
	if err != nil {
		return harness.LaunchSpec{}, err
	}
	spec := harness.LaunchSpec{Env: a.env(st), Dir: lc.Sandbox.Workdir(), Timeout: a.timeout}
	cfg := a.config(a.baseURL(lc.RolloutID, lc.Attempt))
	if lc.Resume {
		if a.opt.ResumePrompt == nil {
			return harness.LaunchSpec{}, errors.New("codex: asked to continue a saved session without resume_prompt set (the resume decision starts over then)")
		}
		file, data, err := readSession(ctx, lc.Sandbox, st)
		if err != nil {
			return harness.LaunchSpec{}, err
		}
		s, err := ParseSession(data)
		if file == "" || err != nil || s.ID == "" {
			return harness.LaunchSpec{}, fmt.Errorf("codex: no saved session with an id to continue in %s (%v)", st.codexHome(), err)
		}
		if err := lc.Sandbox.Upload(ctx, path.Join(st.codexHome(), "config.toml"), []byte(cfg), 0o600); err != nil {
			return harness.LaunchSpec{}, fmt.Errorf("codex: write config.toml: %w", err)
		}
		spec.Argv = append(append([]string{a.opt.Codex, "exec", "resume"}, flags...), "--", s.ID, *a.opt.ResumePrompt)
		return spec, nil
	}
	task, err := harness.TaskArg(lc.Input)
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("codex: %w", err)
	}
	if err := lc.Sandbox.Upload(ctx, path.Join(st.codexHome(), "config.toml"), []byte(cfg), 0o600); err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("codex: write config.toml: %w", err)
	}
	// The task beside the session, for the resume decision.
	if err := lc.Sandbox.Upload(ctx, path.Join(st.Home, taskFileName), []byte(task), 0o600); err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("codex: write the task: %w", err)
	}
	// HOME must exist: Codex keeps files below it.
	if err := lc.Sandbox.Upload(ctx, path.Join(st.Home, "home", ".keep"), nil, 0o600); err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("codex: make HOME: %w", err)
	}
	spec.Argv = append(append([]string{a.opt.Codex, "exec"}, flags...), "--", task)
	return spec, nil
}

// taskFileName is the task's text, kept beside the session, so the resume
// decision can check the session starts with it.
const taskFileName = "task.txt"

// sessionGlob is where, below CODEX_HOME, Codex keeps its session files.
const sessionGlob = "sessions/*/*/*/rollout-*.jsonl"

// readSession reads the state's newest session file: its path and
// content, or "" and nil when there is none.
func readSession(ctx context.Context, sb harness.LentSandbox, st State) (string, []byte, error) {
	file, data, err := harness.ReadNewestFile(ctx, sb, st.codexHome(), sessionGlob)
	if err != nil {
		return "", nil, fmt.Errorf("codex: %w", err)
	}
	return file, data, nil
}

// ResumeDecision implements harness.Adapter. Codex has no way to continue a
// saved session without a new user turn, so a relaunch starts over with
// the task in a fresh folder; the reason says whether the saved session
// could otherwise have been continued (it starts with the task and holds a
// completed model response) and why it is not. With ResumePrompt set
// (opt-in), such a session is continued instead, the reason naming the
// added turn. Only a cancelled ctx, or a state that names no folder, is an
// error.
func (a *Adapter) ResumeDecision(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, rollout string, attempt int) (harness.Decision, error) {
	st, err := parseState(raw)
	if err != nil {
		return harness.Decision{}, err
	}
	fresh := func(why string) (harness.Decision, error) {
		s, _ := json.Marshal(State{Home: harness.StateDir(sb, "codex", rollout, attempt)})
		return harness.Decision{Resume: false, Reason: why + "; starting over with the task in a fresh CODEX_HOME", State: s}, nil
	}
	s, task, why, err := harness.ReadSavedSession(ctx, sb, st.codexHome(), sessionGlob, path.Join(st.Home, taskFileName), "CODEX_HOME", ParseSession)
	if err != nil {
		return harness.Decision{}, err
	}
	if why != "" {
		return fresh(why)
	}
	ok, why := s.Continuable(task)
	switch {
	case !ok:
		return fresh(why)
	case a.opt.ResumePrompt != nil && s.ID != "":
		return harness.Decision{Resume: true, Reason: fmt.Sprintf("%s; continuing it with codex exec resume, which adds the user turn %q the task did not have (resume_prompt is set)", why, *a.opt.ResumePrompt)}, nil
	}
	return fresh(why + ", but Codex cannot continue it without adding a user turn (codex exec resume always sends a new user message)")
}

// Response implements harness.Adapter: the exit code, the session file
// (path, id and its lines), the final assistant text and the output tails.
func (a *Adapter) Response(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, res harness.HarnessResult) (json.RawMessage, error) {
	st, err := parseState(raw)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"exit_code": res.ExitCode}
	file, data, err := readSession(ctx, sb, st)
	switch {
	case err != nil:
		out["session_error"] = err.Error()
	case file == "":
		out["session_error"] = "codex: no session file in " + st.codexHome()
	default:
		s, err := ParseSession(data)
		if err != nil {
			out["session_error"] = err.Error()
			break
		}
		out["session_path"] = file
		out["session_id"] = s.ID
		out["session"] = harness.JSONLinesArray(data)
		if t := s.FinalText(); t != "" {
			out["final_text"] = t
		}
	}
	out["stdout_tail"] = harness.Tail(string(res.Stdout), 4000)
	out["stderr_tail"] = harness.Tail(string(res.Stderr), 4000)
	return json.Marshal(out)
}

var _ harness.Adapter = (*Adapter)(nil)
var _ harness.PausesAtCheckpoints = (*Adapter)(nil)
var _ harness.GymResulter = (*Adapter)(nil)
