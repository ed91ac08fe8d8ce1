// Package pi puts Pi (@mariozechner/pi-coding-agent) on the driver: where
// Pi keeps its session (a per-rollout state folder in the sandbox's
// ngharness folder, carried by the snapshot: its agent folder
// PI_CODING_AGENT_DIR with models.json and settings.json, its sessions),
// how it is launched (Pi's own agent through Pi's SDK by a small launcher
// script run by node, launcher.mjs, fully offline, pointed at the
// rollout's model URL on chat completions), the resume decision, and the
// NeMoGymResponse of the /run reply built from the saved session
// (gymresponse.go).
//
// The task goes to the model byte for byte: the launcher reads it from a
// file and sends it with session.prompt (Pi's CLI takes it only as an
// argument, where a leading dash is an option and @path a file include,
// or trimmed from stdin). After a crash the saved session is continued
// without a turn the task did not have: the launcher saves Pi's own error
// result "No result provided" for each interrupted tool call and runs
// Agent.continue() on the opened session, so the model gets the saved
// history and what was due (Session.Continuation; docs/pi.md). Pi's CLI
// has no such path (with a prompt it adds a user turn, without one it
// sends nothing). A session that cannot be continued starts over in a
// fresh folder, the reason saying why. Pi pauses in place at checkpoints
// by default.
package pi

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/harness"
)

// Options configures the adapter (the `pi:` part of the config).
type Options struct {
	// Pi is the pi command inside the sandbox (node_modules/.bin/pi of
	// @mariozechner/pi-coding-agent, or its dist/cli.js): the launcher runs
	// the SDK of the package it belongs to.
	Pi string `json:"pi"`
	// Node is node inside the sandbox (Node 20.6 or later, Pi's own
	// requirement): a path, or a name found on the launch's PATH ("node"
	// when empty).
	Node string `json:"node"`
	// CLIOptions are the keys every CLI adapter takes. Here model_url is a
	// server speaking chat completions below /v1, the model is the
	// provider's one model, and api_key is sent as a bearer token.
	harness.CLIOptions
}

// Adapter is the Pi adapter.
type Adapter struct {
	opt     Options
	timeout time.Duration
}

// New checks the options (CLIOptions.Check) and returns the adapter.
func New(opt Options) (*Adapter, error) {
	timeout, err := opt.Check("pi", opt.Pi)
	if err != nil {
		return nil, err
	}
	if opt.Node == "" {
		opt.Node = "node"
	}
	return &Adapter{opt: opt, timeout: timeout}, nil
}

// State is where Pi keeps one rollout attempt's session.
type State struct {
	// Home holds home/ (HOME), agent/ (PI_CODING_AGENT_DIR: models.json,
	// settings.json, auth.json), sessions/ (<time>_<uuid>.jsonl), tmp/
	// (TMPDIR), task.txt, the launcher and each launch's file.
	Home string `json:"home"`
}

// Name implements harness.Adapter.
func (a *Adapter) Name() string { return "pi" }

// PausesAtCheckpoints implements harness.PausesAtCheckpoints: on unless the
// config says pause_at_checkpoints: false.
func (a *Adapter) PausesAtCheckpoints() bool { return a.opt.Pauses() }

// NewState implements harness.Adapter.
func (a *Adapter) NewState(rollout string, attempt int, sb harness.LentSandbox) (json.RawMessage, error) {
	return json.Marshal(State{Home: harness.StateDir(sb, "pi", rollout, attempt)})
}

func parseState(raw json.RawMessage) (State, error) {
	home, err := harness.StateHome("pi", raw)
	return State{Home: home}, err
}

func (s State) agentDir() string   { return path.Join(s.Home, "agent") }
func (s State) sessionDir() string { return path.Join(s.Home, "sessions") }
func (s State) launcher() string   { return path.Join(s.Home, launcherName) }

// sessionGlob is where, below the state folder, Pi keeps its session file.
const sessionGlob = "sessions/*.jsonl"

// taskFileName is the task's text, kept beside the session: the launcher
// reads it, and the resume decision checks the session starts with it.
const taskFileName = "task.txt"

// launcherName is the launcher's file in the state folder.
const launcherName = "ngharness-pi.mjs"

// launcherScript is the launcher (launcher.mjs), uploaded at each launch.
//
//go:embed launcher.mjs
var launcherScript []byte

// providerName is the provider models.json defines; keyVar the variable
// it reads the key from.
const (
	providerName = "ngharness"
	keyVar       = "NGHARNESS_PI_API_KEY"
)

// providerTimeout is how long the provider's SDK waits for a reply's
// headers (retry.provider.timeoutMs). Its default, 10 minutes of wall-clock
// time, would count the time a checkpoint keeps Pi paused; a day stays
// under the 2^31 ms a node timer can hold.
const providerTimeout = 24 * time.Hour

// baseURL is the provider's base URL for a rollout attempt: the model URL,
// the rollout prefix, /v1 (Pi adds /chat/completions).
func (a *Adapter) baseURL(rollout string, attempt int) string {
	return strings.TrimRight(a.opt.ModelURL, "/") + "/ng-rollout/" + harness.RolloutSegment(rollout, attempt) + "/v1"
}

// models is $PI_CODING_AGENT_DIR/models.json: one provider at base on
// chat completions (openai-completions) with one model, the system prompt
// as a system message (no developer role) and no reasoning effort, the key
// read from keyVar.
func (a *Adapter) models(base string) ([]byte, error) {
	return json.MarshalIndent(map[string]any{"providers": map[string]any{providerName: map[string]any{
		"baseUrl": base,
		"api":     "openai-completions",
		"apiKey":  keyVar,
		"compat":  map[string]any{"supportsDeveloperRole": false, "supportsReasoningEffort": false},
		"models":  []any{map[string]any{"id": a.opt.Model, "reasoning": false}},
	}}}, "", "  ")
}

// settings is $PI_CODING_AGENT_DIR/settings.json: no install telemetry, a
// quiet start, no retries of Pi's or of the provider's SDK (a retry is a
// repeated model call), the provider's wait for a reply's headers
// providerTimeout, no compaction (a summary the model writes of the
// history would be a turn the task did not have).
var settings = []byte(fmt.Sprintf(`{
  "enableInstallTelemetry": false,
  "quietStartup": true,
  "retry": {"enabled": false, "provider": {"maxRetries": 0, "timeoutMs": %d}},
  "compaction": {"enabled": false}
}
`, providerTimeout.Milliseconds()))

// env is Pi's environment for a state: HOME, PI_CODING_AGENT_DIR and
// TMPDIR in the state folder; every startup network call off
// (PI_OFFLINE: the update and install checks, package checks, tool
// downloads) and telemetry off; the key; then the options' additions.
func (a *Adapter) env(st State) map[string]string {
	env := map[string]string{
		"HOME":                  path.Join(st.Home, "home"),
		"PI_CODING_AGENT_DIR":   st.agentDir(),
		"TMPDIR":                path.Join(st.Home, "tmp"),
		"PI_OFFLINE":            "1",
		"PI_SKIP_VERSION_CHECK": "1",
		"PI_TELEMETRY":          "0",
		keyVar:                  a.opt.APIKey,
	}
	for k, v := range a.opt.Env {
		env[k] = v
	}
	return env
}

// launchFile is what the launcher reads (launcher.mjs says what each key
// means).
type launchFile struct {
	Pi          string        `json:"pi"`
	AgentDir    string        `json:"agent_dir"`
	SessionDir  string        `json:"session_dir"`
	Provider    string        `json:"provider"`
	Model       string        `json:"model"`
	TaskFile    string        `json:"task_file,omitempty"`
	SessionFile string        `json:"session_file,omitempty"`
	Continue    *Continuation `json:"continue,omitempty"`
}

// Launch implements harness.Adapter: the launcher, models.json (pointing
// at this attempt's model URL) and settings.json are written into the
// state folder, then `node ngharness-pi.mjs launch-<id>.json` runs in the
// sandbox's workdir, stdin /dev/null (ngsup's). A fresh launch writes the
// task (TaskText, byte for byte: no argument limit applies) to task.txt,
// which the launcher sends; a resume continues the saved session instead
// (the Session.Continuation the launch file carries).
func (a *Adapter) Launch(ctx context.Context, lc harness.LaunchContext) (harness.LaunchSpec, error) {
	st, err := parseState(lc.State)
	if err != nil {
		return harness.LaunchSpec{}, err
	}
	lf := launchFile{Pi: a.opt.Pi, AgentDir: st.agentDir(), SessionDir: st.sessionDir(), Provider: providerName, Model: a.opt.Model}
	var files []file
	if lc.Resume {
		sessionFile, c, err := a.continuation(ctx, lc.Sandbox, st)
		if err != nil {
			return harness.LaunchSpec{}, err
		}
		lf.SessionFile, lf.Continue = sessionFile, &c
	} else {
		task, err := harness.TaskText(lc.Input)
		if err != nil {
			return harness.LaunchSpec{}, fmt.Errorf("pi: %w", err)
		}
		lf.TaskFile = path.Join(st.Home, taskFileName)
		files = append(files, file{taskFileName, []byte(task)})
	}
	models, err := a.models(a.baseURL(lc.RolloutID, lc.Attempt))
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("pi: models.json: %w", err)
	}
	launch, err := json.Marshal(lf)
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("pi: the launch file: %w", err)
	}
	name := fmt.Sprintf("launch-%s.json", lc.LaunchID)
	files = append(files,
		file{launcherName, launcherScript},
		file{"agent/models.json", models},
		file{"agent/settings.json", settings},
		file{name, launch},
		// Pi writes below HOME and TMPDIR; they must exist.
		file{"home/.keep", nil},
		file{"tmp/.keep", nil},
	)
	for _, f := range files {
		if err := lc.Sandbox.Upload(ctx, path.Join(st.Home, f.name), f.data, 0o600); err != nil {
			return harness.LaunchSpec{}, fmt.Errorf("pi: write %s: %w", f.name, err)
		}
	}
	return harness.LaunchSpec{
		Argv:    []string{a.opt.Node, st.launcher(), path.Join(st.Home, name)},
		Env:     a.env(st),
		Dir:     lc.Sandbox.Workdir(),
		Timeout: a.timeout,
	}, nil
}

// file is one file Launch writes into the state folder.
type file struct {
	name string
	data []byte
}

// continuation reads the saved session of a resume and says how to
// continue it.
func (a *Adapter) continuation(ctx context.Context, sb harness.LentSandbox, st State) (string, Continuation, error) {
	f, data, err := harness.ReadNewestFile(ctx, sb, st.Home, sessionGlob)
	if err != nil {
		return "", Continuation{}, fmt.Errorf("pi: %w", err)
	}
	s, err := ParseSession(data)
	if f == "" || err != nil {
		return "", Continuation{}, fmt.Errorf("pi: no saved session to continue in %s (%v)", st.sessionDir(), err)
	}
	c, err := s.Continuation()
	if err != nil {
		return "", Continuation{}, fmt.Errorf("pi: continue session %s: %w", s.ID, err)
	}
	return f, c, nil
}

// ResumeDecision implements harness.Adapter: a saved session that starts
// with the task, holds a completed model response, ran in the sandbox's
// workdir and has a Continuation is continued (the reason says what the
// model is sent); any other starts over with the task in a fresh folder,
// the reason saying why. Only a cancelled ctx, or a state that names no
// folder, is an error.
func (a *Adapter) ResumeDecision(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, rollout string, attempt int) (harness.Decision, error) {
	st, err := parseState(raw)
	if err != nil {
		return harness.Decision{}, err
	}
	fresh := func(why string) (harness.Decision, error) {
		s, _ := json.Marshal(State{Home: harness.StateDir(sb, "pi", rollout, attempt)})
		return harness.Decision{Resume: false, Reason: why + "; starting over with the task in a fresh Pi state folder", State: s}, nil
	}
	s, task, why, err := harness.ReadSavedSession(ctx, sb, st.Home, sessionGlob, path.Join(st.Home, taskFileName), "Pi state folder", ParseSession)
	if err != nil {
		return harness.Decision{}, err
	}
	if why != "" {
		return fresh(why)
	}
	ok, why := s.Continuable(task)
	if !ok {
		return fresh(why)
	}
	if s.Cwd != sb.Workdir() {
		// Pi runs the tools of an opened session in the header's folder.
		return fresh(fmt.Sprintf("%s, but it ran in %s, not in the sandbox's workdir %s", why, s.Cwd, sb.Workdir()))
	}
	c, err := s.Continuation()
	if err != nil {
		return fresh(fmt.Sprintf("%s, but it cannot be continued (%v)", why, err))
	}
	return harness.Decision{Resume: true, Reason: fmt.Sprintf("%s; continuing it with Agent.continue() through Pi's SDK, sending %s (no turn added)", why, c.What)}, nil
}

// Response implements harness.Adapter: the exit code, the session file
// (path, id and its lines), the final assistant text and the output tails.
func (a *Adapter) Response(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, res harness.HarnessResult) (json.RawMessage, error) {
	st, err := parseState(raw)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"exit_code": res.ExitCode}
	f, data, err := harness.ReadNewestFile(ctx, sb, st.Home, sessionGlob)
	switch {
	case err != nil:
		out["session_error"] = "pi: " + err.Error()
	case f == "":
		out["session_error"] = "pi: no session file in " + st.sessionDir()
	default:
		s, err := ParseSession(data)
		if err != nil {
			out["session_error"] = fmt.Sprintf("pi: the session %s: %v", f, err)
			break
		}
		out["session_path"] = f
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
