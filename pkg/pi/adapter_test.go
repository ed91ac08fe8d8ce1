package pi

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
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
	if opt.Pi == "" {
		opt.Pi = "/opt/pi/bin/pi"
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

func readJSON(t *testing.T, file string, v any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// TestNew: the options' one check names pi.pi when the pi command is
// missing and model_url when it is no URL; node defaults to "node".
func TestNew(t *testing.T) {
	if _, err := New(Options{CLIOptions: harness.CLIOptions{ModelURL: "http://x"}}); err == nil || !strings.Contains(err.Error(), "pi.pi") {
		t.Errorf("no pi: %v", err)
	}
	if _, err := New(Options{Pi: "/opt/pi", CLIOptions: harness.CLIOptions{ModelURL: "x"}}); err == nil || !strings.Contains(err.Error(), "model_url") {
		t.Errorf("a bad model_url: %v", err)
	}
	a, err := New(Options{Pi: "/opt/pi", CLIOptions: harness.CLIOptions{ModelURL: "http://x"}})
	if err != nil || a.opt.Node != "node" || a.opt.Model != "policy" || a.opt.APIKey != "none" || !a.PausesAtCheckpoints() {
		t.Errorf("defaults: %+v, %v", a, err)
	}
}

// TestLaunch: node runs the launcher with the launch file, in the
// sandbox's workdir; the task is task.txt byte for byte (a leading dash,
// @path, a slash command, quotes, $(...), a NUL, newlines at the end, over
// Linux's argument bound: it is never an argument); models.json points the
// one provider at the model URL with the rollout prefix escaped as one
// segment, on chat completions, the key from the environment;
// settings.json turns off retries (Pi's and the provider SDK's), install
// telemetry and compaction; HOME, PI_CODING_AGENT_DIR and TMPDIR are in the
// state folder, PI_OFFLINE is set, and the options' Env overrides.
func TestLaunch(t *testing.T) {
	a, sb, lent := newAdapter(t, Options{Node: "/usr/bin/node", CLIOptions: harness.CLIOptions{Model: "m-1", APIKey: "k", Timeout: "90s",
		Env: map[string]string{"PI_TELEMETRY": "1", "EXTRA": "x y"}}})
	raw, err := a.NewState("r/1?", 2, lent)
	if err != nil {
		t.Fatal(err)
	}
	task := "-x @/etc/hostname /compact 'q' \"dq\" $(touch pwned) `id`\x00\n" + strings.Repeat("long ", 40000) + "\n\n"
	body, _ := json.Marshal(map[string]string{"task": task})
	spec, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r/1?", Attempt: 2, Input: body, Sandbox: lent, State: raw, LaunchID: "l-7"})
	if err != nil {
		t.Fatal(err)
	}
	st := stateOf(t, raw)
	if !strings.HasPrefix(st.Home, filepath.Join(sb.Root(), "state", "pi", "r_1_-a2-")) || spec.Dir != sb.Workdir() || spec.Timeout.String() != "1m30s" || spec.Stdin != "" {
		t.Errorf("state %s, dir %s, timeout %v, stdin %q", st.Home, spec.Dir, spec.Timeout, spec.Stdin)
	}
	want := []string{"/usr/bin/node", st.Home + "/ngharness-pi.mjs", st.Home + "/launch-l-7.json"}
	if strings.Join(spec.Argv, "\x00") != strings.Join(want, "\x00") {
		t.Errorf("argv %q, want %q", spec.Argv, want)
	}
	for k, v := range map[string]string{
		"HOME": st.Home + "/home", "PI_CODING_AGENT_DIR": st.Home + "/agent", "TMPDIR": st.Home + "/tmp",
		"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "1", "NGHARNESS_PI_API_KEY": "k", "EXTRA": "x y",
	} {
		if spec.Env[k] != v {
			t.Errorf("env %s=%q, want %q", k, spec.Env[k], v)
		}
	}
	if got, err := os.ReadFile(filepath.Join(st.Home, "task.txt")); err != nil || string(got) != task {
		t.Errorf("task.txt: %d bytes (%v), want the task's %d byte for byte", len(got), err, len(task))
	}
	if got, err := os.ReadFile(filepath.Join(st.Home, "ngharness-pi.mjs")); err != nil || !bytes.Equal(got, launcherScript) {
		t.Errorf("the launcher: %d bytes (%v)", len(got), err)
	}
	var lf launchFile
	readJSON(t, filepath.Join(st.Home, "launch-l-7.json"), &lf)
	if lf != (launchFile{Pi: "/opt/pi/bin/pi", AgentDir: st.Home + "/agent", SessionDir: st.Home + "/sessions", Provider: "ngharness", Model: "m-1", TaskFile: st.Home + "/task.txt"}) {
		t.Errorf("the launch file %+v", lf)
	}
	var models struct {
		Providers map[string]struct {
			BaseURL string          `json:"baseUrl"`
			API     string          `json:"api"`
			APIKey  string          `json:"apiKey"`
			Compat  map[string]bool `json:"compat"`
			Models  []struct {
				ID        string `json:"id"`
				Reasoning bool   `json:"reasoning"`
			} `json:"models"`
		} `json:"providers"`
	}
	readJSON(t, filepath.Join(st.Home, "agent", "models.json"), &models)
	p := models.Providers["ngharness"]
	if len(models.Providers) != 1 || p.BaseURL != "http://127.0.0.1:9/base/ng-rollout/r%2F1%3F-a2/v1" || p.API != "openai-completions" || p.APIKey != "NGHARNESS_PI_API_KEY" ||
		p.Compat["supportsDeveloperRole"] || p.Compat["supportsReasoningEffort"] || len(p.Models) != 1 || p.Models[0].ID != "m-1" || p.Models[0].Reasoning {
		t.Errorf("models.json %+v", models)
	}
	var set struct {
		Telemetry *bool `json:"enableInstallTelemetry"`
		Retry     struct {
			Enabled  *bool `json:"enabled"`
			Provider struct {
				MaxRetries *int  `json:"maxRetries"`
				TimeoutMs  int64 `json:"timeoutMs"`
			} `json:"provider"`
		} `json:"retry"`
		Compaction struct {
			Enabled *bool `json:"enabled"`
		} `json:"compaction"`
	}
	readJSON(t, filepath.Join(st.Home, "agent", "settings.json"), &set)
	if set.Telemetry == nil || *set.Telemetry || set.Retry.Enabled == nil || *set.Retry.Enabled || set.Retry.Provider.MaxRetries == nil || *set.Retry.Provider.MaxRetries != 0 ||
		set.Retry.Provider.TimeoutMs != 86400000 || set.Compaction.Enabled == nil || *set.Compaction.Enabled {
		t.Errorf("settings.json %+v", set)
	}
	for _, d := range []string{"home", "tmp"} {
		if fi, err := os.Stat(filepath.Join(st.Home, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", d, err)
		}
	}
}

// saveSession writes a session file into a state's sessions folder, and
// the task beside it.
func saveSession(t *testing.T, st State, task string, data []byte) string {
	t.Helper()
	f := filepath.Join(st.Home, "sessions", "2026-12-02T02-19-01-040Z_01a2348c.jsonl")
	for file, content := range map[string][]byte{f: data, filepath.Join(st.Home, "task.txt"): []byte(task)} {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// inWorkdir is a testdata session as if it had run in the sandbox's
// workdir.
func inWorkdir(data []byte, sb *hosttest.Sandbox) []byte {
	return bytes.Replace(data, []byte(`"cwd":"/tmp/pitry/work"`), []byte(`"cwd":"`+sb.Workdir()+`"`), 1)
}

// TestResumeDecision: a session that starts with the task, holds a
// completed response and ran in the workdir is continued, the reason
// saying what is sent; each other case starts over in a fresh folder, the
// reason saying why: no session (Pi writes none before its first reply
// ends), another task, no completed response (the one call failed),
// another working folder, a last line cut short.
func TestResumeDecision(t *testing.T) {
	lines := bytes.SplitAfter(sample(t, "done.jsonl", 0), []byte{'\n'})
	midTool := bytes.Join(lines[:5], nil)
	for _, c := range []struct {
		name   string
		task   string
		data   func(sb *hosttest.Sandbox) []byte
		resume bool
		reason string
	}{
		{"mid-tool", sampleTask, func(sb *hosttest.Sandbox) []byte { return inWorkdir(midTool, sb) }, true,
			`session 01a2348c-5230-7643-a3b8-34b5692d825b starts with the task and holds 1 completed model response; continuing it with Agent.continue() through Pi's SDK, sending the interrupted tool call with Pi's own error result "No result provided" (no turn added)`},
		{"ended", sampleTask, func(sb *hosttest.Sandbox) []byte { return inWorkdir(sample(t, "done.jsonl", 0), sb) }, true,
			"holds 2 completed model responses; continuing it with Agent.continue() through Pi's SDK, sending nothing: the session ended with the model's answer (no turn added)"},
		{"no session", sampleTask, nil, false, "the saved Pi state folder holds no session; starting over with the task in a fresh Pi state folder"},
		{"another task", "another task", func(sb *hosttest.Sandbox) []byte { return inWorkdir(midTool, sb) }, false,
			"the saved session does not start with the task; starting over"},
		{"a failed call", sampleTask, func(sb *hosttest.Sandbox) []byte {
			return bytes.Replace(sample(t, "error.jsonl", 0), []byte(`"cwd":"/tmp/pitry/work"`), []byte(`"cwd":"`+sb.Workdir()+`"`), 1)
		}, false, "the saved session holds no completed model response; starting over"},
		{"another folder", sampleTask, func(*hosttest.Sandbox) []byte { return midTool }, false, "but it ran in /tmp/pitry/work, not in the sandbox's workdir"},
		{"a cut line", sampleTask, func(sb *hosttest.Sandbox) []byte {
			return inWorkdir(append(bytes.Join(lines[:5], nil), lines[5][:40]...), sb)
		}, false,
			"but it cannot be continued (the session file's last line was cut short); starting over"},
	} {
		a, sb, lent := newAdapter(t, Options{})
		raw, _ := a.NewState("r1", 1, lent)
		st := stateOf(t, raw)
		if c.data != nil {
			saveSession(t, st, c.task, c.data(sb))
		}
		d, err := a.ResumeDecision(context.Background(), lent, raw, "r1", 2)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if d.Resume != c.resume || !strings.Contains(d.Reason, c.reason) {
			t.Errorf("%s: resume %v, reason %q; want %v, %q", c.name, d.Resume, d.Reason, c.resume, c.reason)
		}
		if fresh := d.State != nil; fresh == c.resume || (fresh && stateOf(t, d.State).Home == st.Home) {
			t.Errorf("%s: the state after the decision %s (was %s)", c.name, d.State, raw)
		}
	}
}

// TestLaunchResume: a resume's launch file names the saved session and
// the continuation the launcher carries out (the file must end at the
// call's entry; the call gets Pi's error result), and no task.
func TestLaunchResume(t *testing.T) {
	a, sb, lent := newAdapter(t, Options{})
	raw, _ := a.NewState("r1", 1, lent)
	st := stateOf(t, raw)
	f := saveSession(t, st, sampleTask, inWorkdir(sample(t, "done.jsonl", 5), sb))
	spec, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r1", Attempt: 2, Sandbox: lent, State: raw, Resume: true, LaunchID: "l-2"})
	if err != nil {
		t.Fatal(err)
	}
	var lf launchFile
	readJSON(t, spec.Argv[2], &lf)
	if lf.SessionFile != f || lf.TaskFile != "" || lf.Continue == nil || lf.Continue.At != "b35feccd" || len(lf.Continue.Answer) != 1 ||
		lf.Continue.Answer[0] != (Call{"call_fake1", "bash"}) || lf.Continue.Drop != 0 || lf.Continue.Ended {
		t.Errorf("the launch file %+v (continue %+v)", lf, lf.Continue)
	}
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r1", Attempt: 2, Sandbox: lent, State: raw, Resume: true, LaunchID: "l-3"}); err == nil || !strings.Contains(err.Error(), "no saved session") {
		t.Errorf("a resume with no session: %v", err)
	}
}

// TestResponse: the response names the session file and its id, holds its
// lines and the final text, and the output tails; a state with no session
// says so.
func TestResponse(t *testing.T) {
	a, sb, lent := newAdapter(t, Options{})
	raw, _ := a.NewState("r1", 1, lent)
	st := stateOf(t, raw)
	res := harness.HarnessResult{ExitCode: 0, Stdout: []byte("events"), Stderr: []byte("errors")}
	out, err := a.Response(context.Background(), lent, raw, res)
	if err != nil || !strings.Contains(string(out), `"session_error":"pi: no session file in `) {
		t.Errorf("no session: %s (%v)", out, err)
	}
	f := saveSession(t, st, sampleTask, inWorkdir(sample(t, "done.jsonl", 0), sb))
	out, err = a.Response(context.Background(), lent, raw, res)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		ExitCode    int               `json:"exit_code"`
		SessionPath string            `json:"session_path"`
		SessionID   string            `json:"session_id"`
		Session     []json.RawMessage `json:"session"`
		FinalText   string            `json:"final_text"`
		Stdout      string            `json:"stdout_tail"`
		Stderr      string            `json:"stderr_tail"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if r.SessionPath != f || r.SessionID != "01a2348c-5230-7643-a3b8-34b5692d825b" || len(r.Session) != 7 || r.FinalText != "done" || r.Stdout != "events" || r.Stderr != "errors" {
		t.Errorf("response %+v", r)
	}
}
