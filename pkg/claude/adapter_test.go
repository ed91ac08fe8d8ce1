package claude

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/hosttest"
	"github.com/ngharness/ngharness/pkg/harness"
)

// newAdapter is an adapter on a model URL with a path, and a sandbox on
// a host folder.
func newAdapter(t *testing.T, opt Options) (*Adapter, *hosttest.Sandbox, harness.LentSandbox) {
	t.Helper()
	if opt.Claude == "" {
		opt.Claude = "/opt/claude"
	}
	if opt.ModelURL == "" {
		opt.ModelURL = "http://127.0.0.1:9/base/"
	}
	a, err := New(opt)
	if err != nil {
		t.Fatal(err)
	}
	sb := hosttest.New(t)
	return a, sb, harness.LentSandbox{Sandbox: sb}
}

func stateOf(t *testing.T, raw json.RawMessage) State {
	t.Helper()
	st, err := parseState(raw)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestLaunch: the task is the last argv element after "--", byte for byte
// (a leading dash, quotes, $(...), backticks, newlines); HOME,
// CLAUDE_CONFIG_DIR and TMPDIR are in the state folder, which Launch
// makes, with task.txt; ANTHROPIC_BASE_URL is the model URL with the
// rollout prefix escaped as one segment; no retries, every call home off,
// IS_SANDBOX; the options' Env overrides the adapter's own.
func TestLaunch(t *testing.T) {
	a, sb, lent := newAdapter(t, Options{CLIOptions: harness.CLIOptions{Model: "m-1", APIKey: "k", Timeout: "90s",
		Env: map[string]string{"DISABLE_TELEMETRY": "0", "EXTRA": "x y"}}})
	st, err := a.NewState("r/1?", 2, lent)
	if err != nil {
		t.Fatal(err)
	}
	task := "-x 'q' \"dq\" $(touch pwned) `id`\nline2\\n"
	body, _ := json.Marshal(map[string]string{"task": task})
	spec, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r/1?", Attempt: 2, Input: body, Sandbox: lent, State: st})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/opt/claude", "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions", "--model", "m-1", "--", task}
	if strings.Join(spec.Argv, "\x00") != strings.Join(want, "\x00") {
		t.Errorf("argv %q, want %q", spec.Argv, want)
	}
	s := stateOf(t, st)
	if !strings.HasPrefix(s.Home, filepath.Join(sb.Root(), "state", "claude", "r_1_-a2-")) || spec.Dir != sb.Workdir() || spec.Timeout.String() != "1m30s" {
		t.Errorf("state %s, dir %s, timeout %v", s.Home, spec.Dir, spec.Timeout)
	}
	for k, v := range map[string]string{
		"HOME": s.Home + "/home", "CLAUDE_CONFIG_DIR": s.Home + "/config", "TMPDIR": s.Home + "/tmp",
		"ANTHROPIC_BASE_URL": "http://127.0.0.1:9/base/ng-rollout/r%2F1%3F-a2", "ANTHROPIC_API_KEY": "k",
		"CLAUDE_CODE_MAX_RETRIES": "0", "DISABLE_TELEMETRY": "0", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
		"DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1", "EXTRA": "x y",
	} {
		if spec.Env[k] != v {
			t.Errorf("env %s=%q, want %q", k, spec.Env[k], v)
		}
	}
	for _, d := range []string{"home", "tmp", "config"} {
		if fi, err := os.Stat(filepath.Join(s.Home, d)); err != nil || !fi.IsDir() {
			t.Errorf("folder %s: %v", d, err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(s.Home, "task.txt")); err != nil || string(data) != task {
		t.Errorf("task.txt %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(sb.Workdir(), "pwned")); err == nil {
		t.Error("the task ran as shell text")
	}
}

// saveSession puts a fixture as the session of a state, and the task
// beside it.
func saveSession(t *testing.T, st json.RawMessage, fixture, task string) State {
	t.Helper()
	s := stateOf(t, st)
	data := readFixture(t, fixture)
	sess, err := ParseSession(data)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(s.configDir(), "projects", "-work dir 'q'", sess.ID+".jsonl")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Home, taskFileName), []byte(task), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

const fixtureTask = "say hi then run the tool"

// TestLaunchResume: a resume runs claude flags --resume ID
// --resume-session-at AT --input-format stream-json, its stdin
// (LaunchSpec.Stdin) a file in the state folder holding the
// continuation's line; run for real with a stand-in claude, it gets
// exactly those arguments and that input.
func TestLaunchResume(t *testing.T) {
	a, sb, lent := newAdapter(t, Options{})
	st, _ := a.NewState("r1", 1, lent)
	s := saveSession(t, st, "midtool.jsonl", fixtureTask)
	sess := parseFixture(t, "midtool.jsonl")
	c, err := sess.Continuation()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r1", Attempt: 2, LaunchID: "L7", Sandbox: lent, State: st, Resume: true})
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(s.Home, "continue-L7.jsonl")
	flags := []string{"-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions", "--model", "policy",
		"--resume", sess.ID, "--resume-session-at", c.At, "--input-format", "stream-json"}
	if want := append([]string{"/opt/claude"}, flags...); strings.Join(spec.Argv, "\x00") != strings.Join(want, "\x00") || spec.Stdin != in {
		t.Fatalf("argv %q stdin %q, want %q and %q", spec.Argv, spec.Stdin, want, in)
	}
	if data, err := os.ReadFile(in); err != nil || string(data) != string(c.Input)+"\n" {
		t.Errorf("the input file %q %v, want %q", data, err, c.Input)
	}
	if spec.Env["ANTHROPIC_BASE_URL"] != "http://127.0.0.1:9/base/ng-rollout/r1-a2" {
		t.Errorf("base URL %q", spec.Env["ANTHROPIC_BASE_URL"])
	}
	// The stand-in prints its arguments one a line, then its stdin.
	stand := filepath.Join(sb.Dir, "claude $(x)")
	if err := os.WriteFile(stand, []byte("#!/bin/sh\nfor a; do printf '%s\\n' \"$a\"; done\ncat\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stdin, err := os.Open(spec.Stdin)
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	cmd := exec.Command(stand, spec.Argv[1:]...)
	cmd.Stdin = stdin
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), strings.Join(flags, "\n")+"\n"+string(c.Input)+"\n"; got != want {
		t.Errorf("the stand-in got\n%s\nwant\n%s", got, want)
	}
}

// TestLaunchRefuses: a task with a NUL byte or too long for one argument,
// a resume with no saved session, and bad options are errors naming what
// is wrong.
func TestLaunchRefuses(t *testing.T) {
	a, _, lent := newAdapter(t, Options{})
	st, _ := a.NewState("r1", 1, lent)
	for _, c := range []struct {
		task   string
		resume bool
		want   string
	}{
		{strings.Repeat("x", harness.MaxArg), false, "claude: the task is 131072 bytes; Linux passes at most 131071 bytes in one argument"},
		{"a\x00b", false, "claude: the task holds a NUL byte"},
		{"ok", true, "claude: no saved session with an id to continue in"},
	} {
		body, _ := json.Marshal(map[string]string{"task": c.task})
		_, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r1", Attempt: 1, Input: body, Sandbox: lent, State: st, Resume: c.resume})
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("task of %d bytes, resume %v: %v, want %q", len(c.task), c.resume, err, c.want)
		}
	}
	if _, err := a.Launch(context.Background(), harness.LaunchContext{Sandbox: lent, State: json.RawMessage(`{"home":"rel"}`)}); err == nil || !strings.Contains(err.Error(), "names no absolute folder") {
		t.Errorf("a relative state: %v", err)
	}
	for _, c := range []struct {
		opt  Options
		want string
	}{
		{Options{CLIOptions: harness.CLIOptions{ModelURL: "http://h"}}, "claude: the claude binary (claude.claude) is required"},
		{Options{Claude: "c"}, "claude: the model server (claude.model_url) is required"},
		{Options{Claude: "c", CLIOptions: harness.CLIOptions{ModelURL: "127.0.0.1:9"}}, `claude: model_url "127.0.0.1:9" is not an http(s) URL`},
		{Options{Claude: "c", CLIOptions: harness.CLIOptions{ModelURL: "ftp://h"}}, `claude: model_url "ftp://h" is not an http(s) URL`},
		{Options{Claude: "c", CLIOptions: harness.CLIOptions{ModelURL: "http://"}}, `claude: model_url "http://" is not an http(s) URL`},
		{Options{Claude: "c", CLIOptions: harness.CLIOptions{ModelURL: "http://h", Env: map[string]string{"A=B": "1"}}}, `claude: env name "A=B" is not a variable name`},
		{Options{Claude: "c", CLIOptions: harness.CLIOptions{ModelURL: "http://h", Env: map[string]string{"": "1"}}}, `claude: env name "" is not a variable name`},
		{Options{Claude: "c", CLIOptions: harness.CLIOptions{ModelURL: "http://h", Timeout: "soon"}}, `claude: timeout "soon": time: invalid duration "soon"`},
	} {
		if _, err := New(c.opt); err == nil || err.Error() != c.want {
			t.Errorf("New(%+v): %v, want %q", c.opt, err, c.want)
		}
	}
}

// TestResumeDecision: a state with no session, a session of another
// task, or a session with the task alone starts over in a fresh folder,
// the reason saying why; a session killed mid-tool, or one whose tool
// result was saved, is continued, the reason saying what is sent.
func TestResumeDecision(t *testing.T) {
	a, _, lent := newAdapter(t, Options{})
	for _, c := range []struct {
		fixture, task string
		resume        bool
		reason        string
	}{
		{"", fixtureTask, false, "the saved CLAUDE_CONFIG_DIR holds no session; starting over with the task in a fresh CLAUDE_CONFIG_DIR"},
		{"midtool.jsonl", "another task", false, "the saved session does not start with the task; starting over"},
		{"task-only", fixtureTask, false, "the saved session holds no completed model response; starting over"},
		{"midtool.jsonl", fixtureTask, true, "holds 1 completed model response; continuing it at its last entry with claude --resume --resume-session-at, sending the interrupted tool calls with Claude Code's interrupted result (no turn added)"},
		{"noanswer.jsonl", fixtureTask, true, "sending the saved tool results whose answer never came (no turn added)"},
	} {
		st, _ := a.NewState("r1", 1, lent)
		s := stateOf(t, st)
		switch c.fixture {
		case "":
			if err := os.MkdirAll(s.configDir(), 0o755); err != nil {
				t.Fatal(err)
			}
		case "task-only":
			saveSession(t, st, "noanswer.jsonl", c.task)
			files, _ := filepath.Glob(filepath.Join(s.configDir(), sessionGlob))
			data := readFixture(t, "noanswer.jsonl")
			if err := os.WriteFile(files[0], data[:strings.IndexByte(string(data), '\n')+1], 0o600); err != nil {
				t.Fatal(err)
			}
		default:
			saveSession(t, st, c.fixture, c.task)
		}
		d, err := a.ResumeDecision(context.Background(), lent, st, "r1", 2)
		if err != nil {
			t.Fatalf("%s: %v", c.fixture, err)
		}
		if d.Resume != c.resume || !strings.Contains(d.Reason, c.reason) {
			t.Errorf("%s, task %q: resume %v %q; want %v %q", c.fixture, c.task, d.Resume, d.Reason, c.resume, c.reason)
		}
		if c.resume {
			continue
		}
		if fresh := stateOf(t, d.State); fresh.Home == s.Home || !strings.Contains(fresh.Home, "/state/claude/r1-a2-") {
			t.Errorf("%s: a fresh start in %s (was %s)", c.fixture, fresh.Home, s.Home)
		}
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	st, _ := a.NewState("r1", 1, lent)
	if _, err := a.ResumeDecision(cancelled, lent, st, "r1", 2); err == nil {
		t.Error("a cancelled decision is no error")
	}
}
