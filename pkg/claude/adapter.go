// Package claude puts Claude Code (@anthropic-ai/claude-code) on the
// driver: where Claude Code keeps its session (a per-rollout
// CLAUDE_CONFIG_DIR in the sandbox's ngharness state folder, carried by
// the snapshot), how it is launched (`claude -p --output-format
// stream-json`, fully local, pointed at the rollout's model URL on the
// Messages API), the resume decision, and the NeMoGymResponse of the /run
// reply built from the saved session (gymresponse.go).
//
// After a crash the saved session is continued without a turn the task
// did not have: `claude -p --resume` alone would add one (a synthetic
// assistant "No response requested." and a new prompt), but resuming at
// the session's last chain entry (--resume-session-at) with the message
// that was due on stdin (--input-format stream-json: an interrupted tool
// call's error result, or the tool results or prompt whose answer never
// came) sends the model exactly the saved history and that message
// (Session.Continuation; docs/claude.md). Claude Code saves its session
// from a timer, after it has printed a reply and started its tool: before
// a relaunch reads the saved session, what the last launch had sent or
// received but not saved is added to it from that launch's stdout and
// stdin (Unsaved, unsaved.go), so no reply it had is asked for again. A
// session that cannot be continued (not the task's, or no completed model
// response) starts over in a fresh folder. Claude Code pauses in place at
// checkpoints by default.
package claude

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/harness"
)

// Options configures the adapter (the `claude:` part of the config).
type Options struct {
	// Claude is the claude binary inside the sandbox (the native one of
	// @anthropic-ai/claude-code-linux-<arch>, or the npm wrapper).
	Claude string `json:"claude"`
	// CLIOptions are the keys every CLI adapter takes. Here model_url is a
	// server speaking the Messages API below /v1, the model is Claude
	// Code's --model, and api_key is sent as x-api-key.
	harness.CLIOptions
}

// Adapter is the Claude Code adapter.
type Adapter struct {
	opt     Options
	timeout time.Duration
}

// New checks the options (CLIOptions.Check) and returns the adapter.
func New(opt Options) (*Adapter, error) {
	timeout, err := opt.Check("claude", opt.Claude)
	if err != nil {
		return nil, err
	}
	return &Adapter{opt: opt, timeout: timeout}, nil
}

// State is where Claude Code keeps one rollout attempt's session.
type State struct {
	// Home holds home/ (HOME), config/ (CLAUDE_CONFIG_DIR: .claude.json
	// and projects/<cwd>/<uuid>.jsonl), tmp/ (TMPDIR: its shell snapshots
	// and tool output) and task.txt.
	Home string `json:"home"`
}

// Name implements harness.Adapter.
func (a *Adapter) Name() string { return "claude" }

// PausesAtCheckpoints implements harness.PausesAtCheckpoints: on unless the
// config says pause_at_checkpoints: false.
func (a *Adapter) PausesAtCheckpoints() bool { return a.opt.Pauses() }

// NewState implements harness.Adapter.
func (a *Adapter) NewState(rollout string, attempt int, sb harness.LentSandbox) (json.RawMessage, error) {
	return json.Marshal(State{Home: harness.StateDir(sb, "claude", rollout, attempt)})
}

func parseState(raw json.RawMessage) (State, error) {
	home, err := harness.StateHome("claude", raw)
	return State{Home: home}, err
}

func (s State) configDir() string { return path.Join(s.Home, "config") }

// sessionGlob is where, below CLAUDE_CONFIG_DIR, Claude Code keeps its
// session files (one folder a working directory).
const sessionGlob = "projects/*/*.jsonl"

// baseURL is ANTHROPIC_BASE_URL for a rollout attempt: the model URL and
// the rollout prefix (Claude Code adds /v1/messages).
func (a *Adapter) baseURL(rollout string, attempt int) string {
	return strings.TrimRight(a.opt.ModelURL, "/") + "/ng-rollout/" + harness.RolloutSegment(rollout, attempt)
}

// env is Claude Code's environment for a state and rollout attempt: HOME,
// CLAUDE_CONFIG_DIR and TMPDIR in the state folder; the model server and
// its key; no retries (a retry is a repeated model call); every call home
// off (telemetry, error reports, update checks, the bug command, the
// nonessential traffic such as its API host lookups); IS_SANDBOX=1, which
// lets the permission bypass run as root (the lent sandbox is the
// sandbox); then the options' additions.
func (a *Adapter) env(st State, rollout string, attempt int) map[string]string {
	env := map[string]string{
		"HOME":                                     path.Join(st.Home, "home"),
		"CLAUDE_CONFIG_DIR":                        st.configDir(),
		"TMPDIR":                                   path.Join(st.Home, "tmp"),
		"ANTHROPIC_BASE_URL":                       a.baseURL(rollout, attempt),
		"ANTHROPIC_API_KEY":                        a.opt.APIKey,
		"CLAUDE_CODE_MAX_RETRIES":                  "0",
		"DISABLE_TELEMETRY":                        "1",
		"DISABLE_ERROR_REPORTING":                  "1",
		"DISABLE_AUTOUPDATER":                      "1",
		"DISABLE_BUG_COMMAND":                      "1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
		"IS_SANDBOX":                               "1",
	}
	for k, v := range a.opt.Env {
		env[k] = v
	}
	return env
}

// flags are the flags of every `claude -p`: stream-json events (which
// need --verbose), no permission prompts (the lent sandbox is the
// sandbox), the served model.
func (a *Adapter) flags() []string {
	return []string{"-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions", "--model", a.opt.Model}
}

// taskFileName is the task's text, kept beside the session, so the resume
// decision can check the session starts with it.
const taskFileName = "task.txt"

// Launch implements harness.Adapter: the state's folders are made, then
// `claude -p --output-format stream-json --verbose
// --dangerously-skip-permissions --model MODEL -- TASK`, the task one argv
// element (never shell text), stdin /dev/null (ngsup's). A resume
// continues the saved session instead (continueSession).
func (a *Adapter) Launch(ctx context.Context, lc harness.LaunchContext) (harness.LaunchSpec, error) {
	st, err := parseState(lc.State)
	if err != nil {
		return harness.LaunchSpec{}, err
	}
	spec := harness.LaunchSpec{Env: a.env(st, lc.RolloutID, lc.Attempt), Dir: lc.Sandbox.Workdir(), Timeout: a.timeout}
	if lc.Resume {
		return a.continueSession(ctx, lc, st, spec)
	}
	task, err := harness.TaskArg(lc.Input)
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("claude: %w", err)
	}
	rec, err := json.Marshal(LaunchRecord{ID: lc.LaunchID, Dir: lc.LaunchDir})
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("claude: the launch record: %w", err)
	}
	// The task beside the session, for the resume decision; the launch
	// record, for a relaunch to find what this launch printed; the other
	// files make the folders Claude Code expects to exist.
	for _, f := range []struct {
		name string
		data []byte
	}{
		{taskFileName, []byte(task)},
		{"home/.keep", nil},
		{"tmp/.keep", nil},
		{"config/.keep", nil},
		{launchRecordFile, rec},
	} {
		if err := lc.Sandbox.Upload(ctx, path.Join(st.Home, f.name), f.data, 0o600); err != nil {
			return harness.LaunchSpec{}, fmt.Errorf("claude: write %s: %w", f.name, err)
		}
	}
	spec.Argv = append(append([]string{a.opt.Claude}, a.flags()...), "--", task)
	return spec, nil
}

// continueSession is the launch of a resume: the saved session, with
// what the last launch had sent or received but not saved appended to
// its file first (Unsaved), its Continuation, the input written into the
// state folder, then `claude -p ... --resume ID --resume-session-at AT
// --input-format stream-json` with that file as its stdin
// (LaunchSpec.Stdin). The launch record (launchRecordFile) is written
// last, naming this launch.
func (a *Adapter) continueSession(ctx context.Context, lc harness.LaunchContext, st State, spec harness.LaunchSpec) (harness.LaunchSpec, error) {
	file, data, err := harness.ReadNewestFile(ctx, lc.Sandbox, st.configDir(), sessionGlob)
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("claude: %w", err)
	}
	if file != "" {
		last, err := a.lastLaunch(ctx, lc.Sandbox, st)
		if err != nil {
			return harness.LaunchSpec{}, fmt.Errorf("claude: %w", err)
		}
		if add, n, err := Unsaved(data, last.LaunchRecord, last.stdout); err == nil && n > 0 {
			data = append(data, add...)
			if err := lc.Sandbox.Upload(ctx, file, data, 0o600); err != nil {
				return harness.LaunchSpec{}, fmt.Errorf("claude: add the unsaved entries to the session %s: %w", file, err)
			}
		}
	}
	s, err := ParseSession(data)
	if file == "" || err != nil || s.ID == "" {
		return harness.LaunchSpec{}, fmt.Errorf("claude: no saved session with an id to continue in %s (%v)", st.configDir(), err)
	}
	c, err := s.Continuation()
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("claude: continue session %s: %w", s.ID, err)
	}
	in := path.Join(st.Home, fmt.Sprintf("continue-%s.jsonl", lc.LaunchID))
	var input []byte
	if c.Input != nil {
		input = append(append(input, c.Input...), '\n')
	}
	if err := lc.Sandbox.Upload(ctx, in, input, 0o600); err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("claude: write the continuation's input: %w", err)
	}
	rec, err := json.Marshal(LaunchRecord{ID: lc.LaunchID, Dir: lc.LaunchDir, Saved: int64(len(data)), At: c.At, Input: c.Input})
	if err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("claude: the launch record: %w", err)
	}
	if err := lc.Sandbox.Upload(ctx, path.Join(st.Home, launchRecordFile), rec, 0o600); err != nil {
		return harness.LaunchSpec{}, fmt.Errorf("claude: write the launch record: %w", err)
	}
	spec.Stdin = in
	spec.Argv = append(append([]string{a.opt.Claude}, a.flags()...),
		"--resume", s.ID, "--resume-session-at", c.At, "--input-format", "stream-json")
	return spec, nil
}

// lastRun is the last launch on a state's session: its record, and the
// end of its stdout (what is there; none when the record or the file is
// missing). why says what could not be read.
type lastRun struct {
	LaunchRecord
	stdout []byte
	why    string
}

// lastLaunch reads the state's launch record and the last maxStdout bytes
// of that launch's stdout (a first line cut by the bound left out),
// inside the sandbox. Only a cancelled ctx is an error; anything else
// unreadable is lastRun.why.
func (a *Adapter) lastLaunch(ctx context.Context, sb harness.LentSandbox, st State) (lastRun, error) {
	var r lastRun
	raw, ok, err := harness.ReadSandboxFile(ctx, sb, path.Join(st.Home, launchRecordFile))
	switch {
	case err != nil && ctx.Err() != nil:
		return r, err
	case err != nil:
		r.why = fmt.Sprintf("the launch record could not be read (%v)", err)
		return r, nil
	case !ok:
		return r, nil
	}
	if err := json.Unmarshal(raw, &r.LaunchRecord); err != nil || r.stdoutPath() == "" {
		r.why = fmt.Sprintf("the launch record %.200q names no launch folder", raw)
		return r, nil
	}
	out, _, err := harness.ReadTail(ctx, sb, r.stdoutPath(), maxStdout)
	switch {
	case err != nil && ctx.Err() != nil:
		return r, err
	case err != nil:
		r.why = fmt.Sprintf("launch %s's stdout could not be read (%v)", r.ID, err)
	}
	r.stdout = out // none when the launch never started
	return r, nil
}

// ResumeDecision implements harness.Adapter: a saved session that starts
// with the task, holds a completed model response and has a Continuation
// is continued (the reason says what the model is sent); any other starts
// over with the task in a fresh folder, the reason saying why. Only a
// cancelled ctx, or a state that names no folder, is an error.
func (a *Adapter) ResumeDecision(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, rollout string, attempt int) (harness.Decision, error) {
	st, err := parseState(raw)
	if err != nil {
		return harness.Decision{}, err
	}
	fresh := func(why string) (harness.Decision, error) {
		s, _ := json.Marshal(State{Home: harness.StateDir(sb, "claude", rollout, attempt)})
		return harness.Decision{Resume: false, Reason: why + "; starting over with the task in a fresh CLAUDE_CONFIG_DIR", State: s}, nil
	}
	last, err := a.lastLaunch(ctx, sb, st)
	if err != nil {
		return harness.Decision{}, err
	}
	// The session as the launch left it: what it had sent or received but
	// not saved is added (continueSession writes it into the file).
	added, note := 0, ""
	if last.why != "" {
		note = "; " + last.why
	}
	parse := func(data []byte) (*Session, error) {
		add, n, err := Unsaved(data, last.LaunchRecord, last.stdout)
		if err != nil {
			note = fmt.Sprintf("; launch %s's stdout was not added to it (%v)", last.ID, err)
			return ParseSession(data)
		}
		added = n
		return ParseSession(append(append([]byte(nil), data...), add...))
	}
	s, task, why, err := harness.ReadSavedSession(ctx, sb, st.configDir(), sessionGlob, path.Join(st.Home, taskFileName), "CLAUDE_CONFIG_DIR", parse)
	if err != nil {
		return harness.Decision{}, err
	}
	if added > 0 {
		note = entriesNote(added, last.LaunchRecord)
	}
	if why != "" {
		if n := countReplies(last.stdout, ""); n > 0 {
			why += fmt.Sprintf(" (launch %s had printed %d model repl%s before any was saved: the fresh start asks the model again)", last.ID, n, map[bool]string{true: "y", false: "ies"}[n == 1])
		}
		return fresh(why + note)
	}
	ok, why := s.Continuable(task)
	if !ok {
		return fresh(why + note)
	}
	c, err := s.Continuation()
	if err != nil {
		return fresh(fmt.Sprintf("%s, but it cannot be continued (%v)%s", why, err, note))
	}
	return harness.Decision{Resume: true, Reason: fmt.Sprintf("%s; continuing it at its last entry with claude --resume --resume-session-at, sending %s (no turn added)%s", why, c.What, note)}, nil
}

// Response implements harness.Adapter: the exit code, the session file
// (path, id and its lines), the final assistant text and the output tails.
func (a *Adapter) Response(ctx context.Context, sb harness.LentSandbox, raw json.RawMessage, res harness.HarnessResult) (json.RawMessage, error) {
	st, err := parseState(raw)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"exit_code": res.ExitCode}
	file, data, err := harness.ReadNewestFile(ctx, sb, st.configDir(), sessionGlob)
	switch {
	case err != nil:
		out["session_error"] = "claude: " + err.Error()
	case file == "":
		out["session_error"] = "claude: no session file in " + st.configDir()
	default:
		s, err := ParseSession(data)
		if err != nil {
			out["session_error"] = fmt.Sprintf("claude: the session %s: %v", file, err)
			break
		}
		out["session_path"] = file
		out["session_id"] = s.ID
		out["session"] = harness.JSONLinesArray(messageLines(data))
		if t := s.FinalText(); t != "" {
			out["final_text"] = t
		}
	}
	out["stdout_tail"] = harness.Tail(string(res.Stdout), 4000)
	out["stderr_tail"] = harness.Tail(string(res.Stderr), 4000)
	return json.Marshal(out)
}

// messageLines are the lines of a session file a NeMoGymResponse is built
// from: the user and assistant lines whole, and of every other line in
// the chain only its type, uuid and parentUuid (the rest is Claude Code's
// bookkeeping, whose request copies, system prompt and tool list, make up
// most of the file).
func messageLines(data []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(data, []byte{'\n'}) {
		var line struct {
			Type      string `json:"type"`
			UUID      string `json:"uuid"`
			Parent    string `json:"parentUuid"`
			SessionID string `json:"sessionId"`
		}
		if json.Unmarshal(l, &line) != nil {
			continue
		}
		switch {
		case line.Type == "user" || line.Type == "assistant":
			out = append(append(out, bytes.TrimSpace(l)...), '\n')
		case line.UUID != "":
			slim, _ := json.Marshal(line)
			out = append(append(out, slim...), '\n')
		}
	}
	return out
}

var _ harness.Adapter = (*Adapter)(nil)
var _ harness.PausesAtCheckpoints = (*Adapter)(nil)
var _ harness.GymResulter = (*Adapter)(nil)
