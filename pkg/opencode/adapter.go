// Package opencode puts OpenCode on the driver: the adapter (where OpenCode
// keeps its session, how it is launched, whether a saved session can be
// continued, what verify needs), and in resume/ the in-sandbox helper that
// continues a saved session without adding a user turn. BuildGymResponse
// turns a session export into the NeMoGymResponse of NeMo Gym's /run reply,
// as Gym's OpenCode agent builds it (gymresponse.go).
//
// OpenCode keeps its session in SQLite under a per-rollout XDG_DATA_HOME on
// the sandbox's root filesystem, so the owner's snapshot carries it into a
// fork. It pauses at checkpoints by default.
package opencode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/harness"
)

// Options configures the adapter (the `opencode:` part of the config).
type Options struct {
	// OpenCode is the opencode binary inside the sandbox.
	OpenCode string `json:"opencode"`
	// CLIOptions are the keys every CLI adapter takes. Here model_url is
	// an OpenAI-compatible server (without /v1); the rollout prefix
	// /ng-rollout/<id>-a<attempt> is added, as the framework does (the
	// segment escaped: see harness.RolloutSegment).
	harness.CLIOptions
	// ContextWindow and OutputTokens are the model's limits.
	ContextWindow int `json:"context_window"`
	OutputTokens  int `json:"output_tokens"`
	// Permission is OpenCode's permission config ("allow" lets tools run
	// without a prompt, which an unattended rollout needs).
	Permission json.RawMessage `json:"permission"`
	// ResumeBinaries maps an architecture to the host path of ngresume.
	ResumeBinaries map[string]string `json:"-"`
}

// Adapter is the OpenCode adapter.
type Adapter struct {
	opt     Options
	timeout time.Duration
	tools   launch.Tools
}

// New checks the options (CLIOptions.Check, then OpenCode's own) and
// returns the adapter.
func New(opt Options) (*Adapter, error) {
	timeout, err := opt.Check("opencode", opt.OpenCode)
	if err != nil {
		return nil, err
	}
	if opt.ContextWindow <= 0 {
		opt.ContextWindow = 128000
	}
	if opt.OutputTokens <= 0 {
		opt.OutputTokens = 4096
	}
	if len(opt.Permission) == 0 {
		opt.Permission = json.RawMessage(`"allow"`)
	}
	if !json.Valid(opt.Permission) {
		return nil, fmt.Errorf("opencode: permission is not valid JSON: %s", opt.Permission)
	}
	return &Adapter{opt: opt, timeout: timeout}, nil
}

// State is where OpenCode keeps one rollout's session.
type State struct {
	// Home holds the rollout's XDG folders (data/ holds opencode.db).
	Home string `json:"home"`
}

// Name implements harness.Adapter.
func (a *Adapter) Name() string { return "opencode" }

// PausesAtCheckpoints implements harness.PausesAtCheckpoints: on unless the
// config says pause_at_checkpoints: false.
func (a *Adapter) PausesAtCheckpoints() bool { return a.opt.Pauses() }

// NewState implements harness.Adapter.
func (a *Adapter) NewState(rollout string, attempt int, sb harness.LentSandbox) (json.RawMessage, error) {
	return json.Marshal(State{Home: harness.StateDir(sb, "opencode", rollout, attempt)})
}

func parseState(raw json.RawMessage) (State, error) {
	home, err := harness.StateHome("opencode", raw)
	return State{Home: home}, err
}

// env is OpenCode's environment for a rollout: its XDG folders, its config
// (provider pointed at the model server with the rollout's prefix), and the
// switches that keep it local.
func (a *Adapter) env(st State, rollout string, attempt int) (map[string]string, error) {
	base := strings.TrimRight(a.opt.ModelURL, "/") + "/ng-rollout/" + harness.RolloutSegment(rollout, attempt) + "/v1"
	cfg := map[string]any{
		"$schema":           "https://opencode.ai/config.json",
		"model":             "ng/" + a.opt.Model,
		"small_model":       "ng/" + a.opt.Model,
		"autoupdate":        false,
		"share":             "disabled",
		"enabled_providers": []string{"ng"},
		"permission":        a.opt.Permission,
		"provider": map[string]any{"ng": map[string]any{
			"npm":     "@ai-sdk/openai-compatible",
			"name":    "ngharness",
			"options": map[string]any{"baseURL": base, "apiKey": a.opt.APIKey},
			"models": map[string]any{a.opt.Model: map[string]any{
				"name": a.opt.Model, "tool_call": true,
				"limit": map[string]any{"context": a.opt.ContextWindow, "output": a.opt.OutputTokens},
			}},
		}},
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	env := map[string]string{
		"XDG_DATA_HOME":                    path.Join(st.Home, "data"),
		"XDG_CONFIG_HOME":                  path.Join(st.Home, "config"),
		"XDG_CACHE_HOME":                   path.Join(st.Home, "cache"),
		"XDG_STATE_HOME":                   path.Join(st.Home, "state"),
		"OPENCODE_CONFIG_CONTENT":          string(data),
		"OPENCODE_DISABLE_MODELS_FETCH":    "1",
		"OPENCODE_DISABLE_AUTOUPDATE":      "1",
		"OPENCODE_DISABLE_SHARE":           "1",
		"OPENCODE_DISABLE_LSP_DOWNLOAD":    "1",
		"OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
		"OPENCODE_DISABLE_CLAUDE_CODE":     "1",
		"OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
		// It looks up @opencode-ai/plugin even with --pure: point npm at a
		// dead local port so nothing leaves the machine.
		"npm_config_registry": "http://127.0.0.1:9/",
	}
	for k, v := range a.opt.Env {
		env[k] = v
	}
	return env, nil
}

// Launch implements harness.Adapter: `opencode run --format json <task>` for
// a fresh session; ngresume (uploaded now) to continue a saved one.
func (a *Adapter) Launch(ctx context.Context, lc harness.LaunchContext) (harness.LaunchSpec, error) {
	st, err := parseState(lc.State)
	if err != nil {
		return harness.LaunchSpec{}, err
	}
	env, err := a.env(st, lc.RolloutID, lc.Attempt)
	if err != nil {
		return harness.LaunchSpec{}, err
	}
	spec := harness.LaunchSpec{Env: env, Dir: lc.Sandbox.Workdir(), Timeout: a.timeout}
	if lc.Resume {
		bin, err := a.tools.Ensure(ctx, lc.Sandbox, "ngresume", a.opt.ResumeBinaries)
		if err != nil {
			return harness.LaunchSpec{}, fmt.Errorf("opencode: upload the resume helper: %w", err)
		}
		spec.Argv = []string{bin, "--opencode", a.opt.OpenCode}
		return spec, nil
	}
	task, err := harness.TaskText(lc.Input)
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("opencode: %w", err)
	}
	// The task goes in on stdin: opencode run stores a message argument
	// that holds a space with literal quotes around it, and fails on one
	// that is a number. Read from stdin, the text is stored exactly.
	taskFile := path.Join(st.Home, taskFileName)
	if err := lc.Sandbox.Upload(ctx, taskFile, []byte(task), 0o600); err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("opencode: upload the task: %w", err)
	}
	spec.Argv = []string{"/bin/sh", "-c", `exec "$0" run --format json <"$1"`, a.opt.OpenCode, taskFile}
	return spec, nil
}

// taskFileName is the task's text, kept beside the session, so the resume
// decision can check the session starts with it.
const taskFileName = "task.txt"

// exported is what `opencode export` prints: the session and its messages.
type exported struct {
	Info struct {
		ID        string `json:"id"`
		Directory string `json:"directory"`
	} `json:"info"`
	Messages []struct {
		Info struct {
			ID       string `json:"id"`
			Role     string `json:"role"`
			ParentID string `json:"parentID"`
			Finish   string `json:"finish"`
			Time     struct {
				Completed float64 `json:"completed"`
			} `json:"time"`
		} `json:"info"`
		Parts []exportedPart `json:"parts"`
	} `json:"messages"`
}

// exportedPart is one part of an exported message.
type exportedPart struct {
	Type  string `json:"type"`
	Text  string `json:"text"`
	State struct {
		// Status is a tool part's: pending, running, completed, error.
		Status string `json:"status"`
	} `json:"state"`
}

// Files the adapter has OpenCode write its JSON output to, in the rollout's
// folder, before reading them back (see runToFile).
const (
	sessionsFileName = "sessions.json"
	exportFileName   = "export.json"
)

// toFileScript runs "$@" with its stdout in the file $1 (its folder made
// first), prints the file and removes it; it exits with the first failure.
// Everything it is given arrives as an argument, never as shell text.
const toFileScript = `out=$1; shift
mkdir -p -- "${out%/*}" && "$@" >"$out" && cat -- "$out"
rc=$?; rm -f -- "$out"; exit $rc`

// runToFile runs OpenCode with args in the sandbox and returns what it
// printed. OpenCode writes its stdout to a file inside the sandbox, which
// is then read with cat: written straight into the exec channel's pipe,
// OpenCode exits before the pipe drains, and anything past the first 64 KiB
// or so is lost (a 195 KB export came through whole in 2 to 3 runs of 10);
// written to a file it is always whole, and cat waits for the pipe.
func (a *Adapter) runToFile(ctx context.Context, sb harness.LentSandbox, env map[string]string, file string, args ...string) (sandbox.ExecResult, error) {
	argv := append([]string{"/bin/sh", "-c", toFileScript, "sh", file, a.opt.OpenCode}, args...)
	return sb.Exec(ctx, sandbox.ExecRequest{Argv: argv, Env: env, Dir: sb.Workdir(), Timeout: 2 * time.Minute})
}

// export runs `opencode export` in the sandbox for the rollout's latest
// session. It returns nil, nil when there is no session. An export that is
// not one whole JSON document is taken again once before it is an error.
func (a *Adapter) export(ctx context.Context, sb harness.LentSandbox, st State, rollout string, attempt int) (*exported, json.RawMessage, error) {
	env, err := a.env(st, rollout, attempt)
	if err != nil {
		return nil, nil, err
	}
	res, err := a.runToFile(ctx, sb, env, path.Join(st.Home, sessionsFileName), "session", "list", "--format", "json")
	if err != nil {
		return nil, nil, fmt.Errorf("opencode: list sessions: %w", err)
	}
	if res.ExitCode != 0 {
		return nil, nil, fmt.Errorf("opencode: list sessions exited %d: %.300s", res.ExitCode, res.Stderr)
	}
	var sessions []struct {
		ID       string  `json:"id"`
		ParentID string  `json:"parentID"`
		Updated  float64 `json:"updated"`
	}
	out := strings.TrimSpace(string(res.Stdout))
	if out == "" {
		return nil, nil, nil
	}
	if err := json.Unmarshal([]byte(out), &sessions); err != nil {
		return nil, nil, fmt.Errorf("opencode: read the session list %.200q: %w", out, err)
	}
	id := ""
	var best float64
	for _, s := range sessions {
		if s.ParentID == "" && (id == "" || s.Updated > best) {
			id, best = s.ID, s.Updated
		}
	}
	if id == "" {
		return nil, nil, nil
	}
	for try := 1; ; try++ {
		res, err = a.runToFile(ctx, sb, env, path.Join(st.Home, exportFileName), "export", id)
		if err != nil {
			return nil, nil, fmt.Errorf("opencode: export session %s: %w", id, err)
		}
		if res.ExitCode != 0 {
			return nil, nil, fmt.Errorf("opencode: export session %s exited %d: %.300s", id, res.ExitCode, res.Stderr)
		}
		e, raw, err := parseExport(res.Stdout)
		if err == nil {
			return e, raw, nil
		}
		if try == 2 {
			return nil, nil, fmt.Errorf("opencode: the export of session %s is not one whole JSON document (%d bytes, twice): %w", id, len(res.Stdout), err)
		}
	}
}

// parseExport reads what `opencode export` printed: a banner, then the
// session as one JSON document, which must be whole.
func parseExport(out []byte) (*exported, json.RawMessage, error) {
	raw := out
	if i := bytes.IndexByte(raw, '{'); i > 0 {
		raw = raw[i:] // a banner before the JSON
	}
	var e exported
	if err := json.Unmarshal(raw, &e); err != nil {
		return nil, nil, err
	}
	return &e, json.RawMessage(raw), nil
}

// ResumeDecision implements harness.Adapter: a saved session is continued
// only if it starts with the task and holds a completed model response;
// otherwise the relaunch starts over with the task in a fresh folder. A
// saved session (or task) that cannot be read starts over too, the reason
// naming what failed: the rollout goes on. Only a cancelled ctx, or a
// state that names no folder, is an error.
func (a *Adapter) ResumeDecision(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, rollout string, attempt int) (harness.Decision, error) {
	st, err := parseState(raw)
	if err != nil {
		return harness.Decision{}, err
	}
	fresh := func(why string) (harness.Decision, error) {
		s, _ := json.Marshal(State{Home: harness.StateDir(sb, "opencode", rollout, attempt)})
		return harness.Decision{Resume: false, Reason: why + "; starting over with the task in a fresh data folder", State: s}, nil
	}
	e, _, err := a.export(ctx, sb, st, rollout, attempt)
	if err != nil {
		if ctx.Err() != nil {
			return harness.Decision{}, err
		}
		return fresh(fmt.Sprintf("the saved session could not be read (%v)", err))
	}
	if e == nil {
		return fresh("the saved data folder holds no session")
	}
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", path.Join(st.Home, taskFileName)}, Timeout: time.Minute})
	if err != nil {
		if ctx.Err() != nil {
			return harness.Decision{}, err
		}
		return fresh(fmt.Sprintf("the task beside the saved session could not be read (%v)", err))
	}
	if res.ExitCode != 0 {
		return fresh("the saved data folder holds no task")
	}
	d, err := decide(e, string(res.Stdout))
	if err == nil && !d.Resume {
		return fresh(strings.TrimSuffix(d.Reason, "; starting over with the task in a fresh data folder"))
	}
	return d, err
}

// decide applies the rule to an exported session. task, if set, must be the
// first user message's text.
func decide(e *exported, task string) (harness.Decision, error) {
	var firstUser string
	haveUser := false
	completed := 0
	for _, m := range e.Messages {
		switch m.Info.Role {
		case "user":
			if !haveUser {
				haveUser = true
				for _, p := range m.Parts {
					if p.Type == "text" {
						firstUser += p.Text
					}
				}
			}
		case "assistant":
			if responded(m.Info.Time.Completed, m.Info.Finish, m.Parts) {
				completed++
			}
		}
	}
	switch {
	case !haveUser:
		return harness.Decision{Resume: false, Reason: "the saved session has no user message; starting over with the task in a fresh data folder"}, nil
	case task != "" && strings.TrimSpace(firstUser) != strings.TrimSpace(task):
		return harness.Decision{Resume: false, Reason: "the saved session does not start with the task; starting over with the task in a fresh data folder"}, nil
	case completed == 0:
		return harness.Decision{Resume: false, Reason: "the saved session holds no completed model response; starting over with the task in a fresh data folder"}, nil
	}
	plural := "s"
	if completed == 1 {
		plural = ""
	}
	return harness.Decision{Resume: true, Reason: fmt.Sprintf("session %s starts with the task and holds %d completed model response%s", e.Info.ID, completed, plural)}, nil
}

// responded tells whether an assistant message holds a completed model
// response: the message is completed or has a finish reason, or it holds a
// tool call the model finished sending (a tool part past "pending"). A
// message whose tool is still running (the state a checkpoint taken
// mid-tool saves) has neither time.completed nor finish: OpenCode sets them
// only once its tools have returned, yet the model's reply was complete.
func responded(completedAt float64, finish string, parts []exportedPart) bool {
	if completedAt > 0 || finish != "" {
		return true
	}
	for _, p := range parts {
		if p.Type == "tool" {
			switch p.State.Status {
			case "running", "completed", "error":
				return true
			}
		}
	}
	return false
}

// Response implements harness.Adapter: the final assistant text and the
// session export, for the owner's verify.
func (a *Adapter) Response(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, res harness.HarnessResult) (json.RawMessage, error) {
	st, err := parseState(raw)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"exit_code": res.ExitCode}
	e, exportRaw, err := a.exportAny(ctx, sb, st)
	if err != nil {
		out["export_error"] = err.Error()
	}
	if e != nil {
		out["session_id"] = e.Info.ID
		out["session"] = exportRaw
		for _, m := range e.Messages {
			if m.Info.Role != "assistant" {
				continue
			}
			var t strings.Builder
			for _, p := range m.Parts {
				if p.Type == "text" {
					t.WriteString(p.Text)
				}
			}
			if t.Len() > 0 {
				out["final_text"] = t.String()
			}
		}
	}
	out["stdout_tail"] = harness.Tail(string(res.Stdout), 4000)
	out["stderr_tail"] = harness.Tail(string(res.Stderr), 4000)
	if exportRaw != nil {
		out["export_path"] = path.Join(st.Home, exportFileName)
	}
	return json.Marshal(out)
}

// GymResult implements harness.GymResulter, as Gym's OpenCode agent builds
// its /run reply: `response` is the NeMoGymResponse of the session export
// (BuildGymResponse, the request side from the body's
// responses_create_params, the model from Options.Model), and the agent's
// opencode_* fields go beside it.
func (a *Adapter) GymResult(response, body json.RawMessage) (json.RawMessage, map[string]json.RawMessage, error) {
	var r struct {
		ExitCode   int             `json:"exit_code"`
		Session    json.RawMessage `json:"session"`
		ExportPath string          `json:"export_path"`
		Stdout     string          `json:"stdout_tail"`
		Stderr     string          `json:"stderr_tail"`
	}
	if err := json.Unmarshal(response, &r); err != nil {
		return nil, nil, fmt.Errorf("opencode: the stored response is not the adapter's: %w", err)
	}
	opt, err := gym.ResponseOptionsFromBody(body, a.opt.Model)
	if err != nil {
		return nil, nil, err
	}
	gr, found, err := BuildGymResponse(r.Session, opt)
	if err != nil {
		return nil, nil, err
	}
	resp, err := json.Marshal(gr)
	if err != nil {
		return nil, nil, err
	}
	runFields := GymRunFields{RunStdout: r.Stdout, RunStderr: r.Stderr, ExportFound: found, Finished: r.ExitCode == 0}
	if found {
		runFields.ResultsFpath = r.ExportPath
	}
	fields, err := harness.JSONFields(runFields)
	return resp, fields, err
}

// exportAny exports without the rollout's model prefix (the export needs no
// model).
func (a *Adapter) exportAny(ctx context.Context, sb harness.LentSandbox, st State) (*exported, json.RawMessage, error) {
	return a.export(ctx, sb, st, "export", 0)
}

var _ harness.Adapter = (*Adapter)(nil)
var _ harness.PausesAtCheckpoints = (*Adapter)(nil)
var _ harness.GymResulter = (*Adapter)(nil)
