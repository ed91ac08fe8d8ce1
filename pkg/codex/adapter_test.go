package codex

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/harness"
)

// uploads is a sandbox that records uploads and runs nothing.
type uploads struct {
	files map[string][]byte
}

func (u *uploads) ID() string { return "sb1" }
func (u *uploads) Exec(context.Context, sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{ExitCode: 1}, nil
}
func (u *uploads) Upload(_ context.Context, p string, data []byte, _ uint32) error {
	u.files[p] = data
	return nil
}
func (u *uploads) Root() string    { return "/sandbox/.ngharness" }
func (u *uploads) Workdir() string { return "/sandbox/work" }

// TestLaunch: the task goes in as the last argv element after "--", byte
// for byte (quotes, $(...), backticks, newlines, a leading dash); the
// config names the model server with the rollout's prefix, the model as a
// TOML string, no retries, and every call home off; HOME and CODEX_HOME
// are in the state folder.
func TestLaunch(t *testing.T) {
	a, err := New(Options{Codex: "/opt/codex", CLIOptions: harness.CLIOptions{ModelURL: "http://127.0.0.1:9/", Model: `we"ird\model`}})
	if err != nil {
		t.Fatal(err)
	}
	sb := &uploads{files: map[string][]byte{}}
	lent := harness.LentSandbox{Sandbox: sb}
	st, err := a.NewState("r/1?", 2, lent)
	if err != nil {
		t.Fatal(err)
	}
	task := "-x 'q' \"dq\" $(touch /tmp/pwned) `id`\nline2\\n"
	body, _ := json.Marshal(map[string]string{"task": task})
	spec, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r/1?", Attempt: 2, Input: body, Sandbox: lent, State: st})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/opt/codex", "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--", task}
	if strings.Join(spec.Argv, "\x00") != strings.Join(want, "\x00") {
		t.Errorf("argv %q, want %q", spec.Argv, want)
	}
	var s State
	_ = json.Unmarshal(st, &s)
	if !strings.HasPrefix(s.Home, "/sandbox/.ngharness/state/codex/r_1_-a2-") || spec.Env["CODEX_HOME"] != s.Home+"/codex" || spec.Env["HOME"] != s.Home+"/home" || spec.Dir != "/sandbox/work" {
		t.Errorf("state %s, env %v, dir %s", s.Home, spec.Env, spec.Dir)
	}
	cfg := string(sb.files[s.Home+"/codex/config.toml"])
	for _, line := range []string{
		`model = "we\"ird\\model"`,
		`base_url = "http://127.0.0.1:9/ng-rollout/r%2F1%3F-a2/v1"`,
		`wire_api = "responses"`, `request_max_retries = 0`, `stream_max_retries = 0`,
		`check_for_update_on_startup = false`, "[analytics]\nenabled = false", "[feedback]\nenabled = false",
		`exporter = "none"`, "[features]\nplugins = false",
	} {
		if !strings.Contains(cfg, line) {
			t.Errorf("config.toml lacks %q:\n%s", line, cfg)
		}
	}
	if string(sb.files[s.Home+"/task.txt"]) != task {
		t.Errorf("task.txt %q", sb.files[s.Home+"/task.txt"])
	}
}

// TestLaunchRefuses: a task Linux cannot pass as one argument, a NUL byte,
// a resume (never decided) and a bad model URL are errors naming what is
// wrong.
func TestLaunchRefuses(t *testing.T) {
	a, err := New(Options{Codex: "/opt/codex", CLIOptions: harness.CLIOptions{ModelURL: "http://127.0.0.1:9"}})
	if err != nil {
		t.Fatal(err)
	}
	lent := harness.LentSandbox{Sandbox: &uploads{files: map[string][]byte{}}}
	st, _ := a.NewState("r1", 1, lent)
	for _, c := range []struct {
		task   string
		resume bool
		want   string
	}{
		{strings.Repeat("x", harness.MaxArg), false, "at most 131071 bytes"},
		{"a\x00b", false, "NUL"},
		{"ok", true, "without resume_prompt set"},
	} {
		body, _ := json.Marshal(map[string]string{"task": c.task})
		_, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r1", Attempt: 1, Input: body, Sandbox: lent, State: st, Resume: c.resume})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("task of %d bytes, resume %v: %v, want %q", len(c.task), c.resume, err, c.want)
		}
	}
	if _, err := New(Options{Codex: "/opt/codex", CLIOptions: harness.CLIOptions{ModelURL: "127.0.0.1:9"}}); err == nil || !strings.Contains(err.Error(), "model_url") {
		t.Errorf("bad model URL: %v", err)
	}
}
