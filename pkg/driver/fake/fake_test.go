package fake

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/gymcheck"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/harness"
)

// runScript runs harness.sh on this machine (no sandbox) with every extra
// process off, and returns its stdout and exit code.
func runScript(t *testing.T, session, work string, env map[string]string, args ...string) (string, int) {
	t.Helper()
	script := filepath.Join(t.TempDir(), "harness.sh")
	if err := os.WriteFile(script, []byte(scriptText()), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", append([]string{script, session, work}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "FAKE_CHILD=0", "FAKE_OWN_SESSION=0", "FAKE_DAEMON=0", "FAKE_UNTAGGED=0", "FAKE_STEP_S=0.01"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func scriptText() string { return string(script) }

// TestHarnessStepsOnceAndContinuesASavedSession proves the fake harness's
// contract: each step is recorded once in the session and the workdir, a
// relaunch on the saved session goes on after the last step (no step
// repeated), the response is the last line of JSON with the task text
// (less '"', '\' and newlines) and the exit code is FAKE_EXIT_CODE.
func TestHarnessStepsOnceAndContinuesASavedSession(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	session, work := filepath.Join(dir, "session"), filepath.Join(dir, "work")
	out, code := runScript(t, session, work, map[string]string{"FAKE_STEPS": "3"}, `say "hi"`, "two  words")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var resp struct {
		Steps     int    `json:"steps"`
		FirstStep int    `json:"first_step"`
		Task      string `json:"task"`
	}
	if err := json.Unmarshal([]byte(lastLine(out)), &resp); err != nil {
		t.Fatalf("the last line is not JSON: %q: %v", out, err)
	}
	if resp.Steps != 3 || resp.FirstStep != 1 || resp.Task != "say hi two  words" {
		t.Errorf("response %+v", resp)
	}
	// A relaunch on the saved session goes on after step 3.
	out, code = runScript(t, session, work, map[string]string{"FAKE_STEPS": "5", "FAKE_EXIT_CODE": "3"})
	if code != 3 {
		t.Errorf("exit %d, want FAKE_EXIT_CODE 3", code)
	}
	if !strings.Contains(out, `"first_step":4`) || !strings.Contains(out, `"steps":5`) {
		t.Errorf("the relaunch printed %q, want it to go on from step 4", out)
	}
	for _, f := range []string{filepath.Join(session, "steps"), filepath.Join(work, "progress")} {
		data, _ := os.ReadFile(f)
		if string(data) != "step 1\nstep 2\nstep 3\nstep 4\nstep 5\n" {
			t.Errorf("%s holds %q, want each step once", f, data)
		}
	}
}

// TestReadStepsOfARealSession reads what the harness wrote: ReadSteps the
// lines of its steps file, Steps their numbers, ReadPids its pids file; a
// session with no step yet has no file (fs.ErrNotExist) and no numbers.
func TestReadStepsOfARealSession(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	session := filepath.Join(dir, "session")
	if _, err := ReadSteps(session); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no session yet: %v, want fs.ErrNotExist", err)
	}
	if got := Steps(session); got != nil {
		t.Errorf("no session yet: steps %v", got)
	}
	if _, code := runScript(t, session, filepath.Join(dir, "work"), map[string]string{"FAKE_STEPS": "3"}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	got, err := ReadSteps(session)
	if want := []string{"step 1", "step 2", "step 3"}; err != nil || !slices.Equal(got, want) || !slices.Equal(StepLines(1, 3), want) {
		t.Errorf("ReadSteps: %q %v, want %q", got, err, want)
	}
	if n := Steps(session); !slices.Equal(n, []int{1, 2, 3}) {
		t.Errorf("Steps: %v", n)
	}
	if r, err := ReadPids(session); err != nil || len(r) != 1 || r[0].Kind != "harness" || r[0].PID <= 0 {
		t.Errorf("ReadPids: %+v %v, want the harness alone (its other processes are off)", r, err)
	}
	if got := ParseSteps([]byte("step 1\n\nstep 2\n")); !slices.Equal(got, []string{"step 1", "step 2"}) {
		t.Errorf("ParseSteps leaves empty lines out: %q", got)
	}
}

// newSandbox makes a local sandbox without namespaces (paths are host
// paths), enough for the adapter's own calls.
func newSandbox(t *testing.T) harness.LentSandbox {
	t.Helper()
	b, err := local.New(t.TempDir(), local.Options{Isolation: local.IsolationNone})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Create(context.Background(), "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	return harness.LentSandbox{Sandbox: sb, Descriptor: sandbox.Descriptor{Provider: "local", SandboxID: sb.ID(), Workdir: sb.Workdir()}}
}

// TestResumeDecision proves that a saved session with completed steps is
// continued (the reason counts them), and that one without is started over
// in a fresh session folder; a state naming no absolute folder is an error.
func TestResumeDecision(t *testing.T) {
	t.Parallel()
	a := &Adapter{}
	sb := newSandbox(t)
	ctx := context.Background()
	raw, err := a.NewState("r/1", 1, sb)
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(raw, &st); err != nil || !strings.HasPrefix(st.SessionDir, sb.Root()) || strings.Contains(filepath.Base(st.SessionDir), "/") {
		t.Fatalf("state %s", raw)
	}
	d, err := a.ResumeDecision(ctx, sb, raw, "r/1", 2)
	if err != nil {
		t.Fatal(err)
	}
	if d.Resume || d.State == nil || string(d.State) == string(raw) {
		t.Errorf("an empty session: decision %+v, want a fresh state", d)
	}
	if err := os.MkdirAll(st.SessionDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(st.SessionDir, "steps"), []byte("step 1\nstep 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err = a.ResumeDecision(ctx, sb, raw, "r/1", 2)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Resume || d.Reason != "the saved session holds 2 completed steps" || d.State != nil {
		t.Errorf("a saved session with 2 steps: decision %+v", d)
	}
	if _, err := a.ResumeDecision(ctx, sb, json.RawMessage(`{"session_dir":"relative"}`), "r", 1); err == nil {
		t.Errorf("a relative session folder was accepted")
	}
}

// TestLaunchPassesTaskAsOneArgument proves that Launch uploads the script
// and hands the task text to it as one argv word, untouched, with the
// task's fake options (over the adapter's defaults) in the environment; bad
// options are an error naming them.
func TestLaunchPassesTaskAsOneArgument(t *testing.T) {
	t.Parallel()
	a := &Adapter{Defaults: Options{Steps: 4, StepSeconds: 0.2}}
	sb := newSandbox(t)
	state, _ := a.NewState("r", 1, sb)
	text := "$(touch /tmp/x) `id`; 'q' \"dq\"\n*"
	body, _ := json.Marshal(map[string]any{"task": text, "fake": map[string]any{"steps": 9, "ignore_sigint": true, "daemon": false}})
	spec, err := a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r", Attempt: 1, Input: body, Sandbox: sb, State: state})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(spec.Argv); n != 5 || spec.Argv[4] != text {
		t.Errorf("argv %q: want the task as its one last word", spec.Argv)
	}
	if data, err := os.ReadFile(spec.Argv[1]); err != nil || string(data) != scriptText() {
		t.Errorf("the script was not uploaded to %s: %v", spec.Argv[1], err)
	}
	for k, v := range map[string]string{"FAKE_STEPS": "9", "FAKE_STEP_S": "0.2", "FAKE_IGNORE_SIGINT": "1", "FAKE_DAEMON": "0", "FAKE_CHILD": "1"} {
		if spec.Env[k] != v {
			t.Errorf("%s=%q, want %q", k, spec.Env[k], v)
		}
	}
	bad, _ := json.Marshal(map[string]any{"fake": map[string]any{"steps": "many"}})
	if _, err := a.Launch(context.Background(), harness.LaunchContext{Input: bad, Sandbox: sb, State: state}); err == nil || !strings.Contains(err.Error(), "fake options") {
		t.Errorf("bad fake options: %v", err)
	}
}

// TestGymResponseFromTheSession proves that the response a fake run's /run
// reply and its verify carry is a NeMoGymResponse built from the harness's
// saved session (gymcheck.Response: every field of Gym's model,
// one assistant message a step, the last one the final answer, the usage
// counted), with what the harness printed in the fake_* fields beside it;
// and that a harness that failed or printed no JSON still gives a
// NeMoGymResponse of the steps it took, with fake_finished false and
// fake_error saying why, while one with no session gives no output and a
// null usage.
func TestGymResponseFromTheSession(t *testing.T) {
	t.Parallel()
	a := &Adapter{}
	sb := newSandbox(t)
	ctx := context.Background()
	state, _ := a.NewState("r", 0, sb)
	var st State
	json.Unmarshal(state, &st)
	out, code := runScript(t, st.SessionDir, sb.Workdir(), map[string]string{"FAKE_STEPS": "3"}, "count to three")
	body := json.RawMessage(`{"task":"count to three","_ng_rollout_id":"r"}`)
	stored, err := a.Response(ctx, sb, state, harness.HarnessResult{ExitCode: code, Stdout: []byte(out)})
	if err != nil {
		t.Fatal(err)
	}
	fields := gymcheck.Reply(t, a, stored, body, "", "step 3")
	want := map[string]string{"fake_text": `"done after 3 steps"`, "fake_steps": "3", "fake_first_step": "1",
		"fake_task": `"count to three"`, "fake_finished": "true", "fake_session_found": "true"}
	for k, v := range want {
		if string(fields[k]) != v {
			t.Errorf("%s = %s, want %s (fields %v)", k, fields[k], v, fields)
		}
	}
	resp, _, err := a.GymResult(stored, body)
	if err != nil {
		t.Fatal(err)
	}
	var gr struct {
		Model  string `json:"model"`
		Output []struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage struct {
			InputTokens, OutputTokens, TotalTokens int
		} `json:"usage"`
	}
	json.Unmarshal(resp, &gr)
	var texts []string
	for _, it := range gr.Output {
		texts = append(texts, it.Content[0].Text)
	}
	if gr.Model != Model || strings.Join(texts, "|") != "step 1|step 2|step 3" {
		t.Errorf("model %q, output %q; want %s and the three steps", gr.Model, texts, Model)
	}
	var u map[string]json.RawMessage
	json.Unmarshal(resp, &u)
	if string(u["usage"]) != `{"input_tokens":9,"input_tokens_details":{"cached_tokens":0},"output_tokens":6,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":15}` {
		t.Errorf("usage %s, want 3 turns of 3 words in and 2 out", u["usage"])
	}
	// The model the run body asks for is the response's.
	named, _, _ := a.GymResult(stored, json.RawMessage(`{"responses_create_params":{"model":"policy"}}`))
	if !strings.Contains(string(named), `"model":"policy"`) {
		t.Errorf("the body's model was not used: %s", named)
	}

	for name, res := range map[string]harness.HarnessResult{
		"exit 3":  {ExitCode: 3, Stdout: []byte(`{"steps":3}`), Stderr: []byte("boom")},
		"no JSON": {Stdout: []byte("not json")},
	} {
		stored, err := a.Response(ctx, sb, state, res)
		if err != nil {
			t.Fatal(err)
		}
		fields := gymcheck.Reply(t, a, stored, body, "", "step 3")
		if string(fields["fake_finished"]) != "false" || len(fields["fake_error"]) < 3 {
			t.Errorf("%s: fields %v, want fake_finished false and fake_error", name, fields)
		}
	}
	missing, _ := a.NewState("r", 1, sb)
	stored, err = a.Response(ctx, sb, missing, harness.HarnessResult{ExitCode: 1})
	if err != nil {
		t.Fatal(err)
	}
	resp, fields, err = a.GymResult(stored, body)
	json.Unmarshal(resp, &u)
	if err != nil || string(u["output"]) != "[]" || string(u["usage"]) != "null" || string(fields["fake_session_found"]) != "false" {
		t.Errorf("no session: %s %v %v; want no output, a null usage, fake_session_found false", resp, fields, err)
	}
}

// TestAnInterruptNeverSplitsAStep proves that a SIGINT (a stop's first
// signal) that reaches the fake harness between a step's two lines, the
// session's and the workdir's, is taken only once the step is whole: the
// harness exits 130 with as many steps in its session as lines in
// progress. Before, sh died at once, and a relaunch on the saved session
// skipped a step progress never got (a verify's check then failed, seen
// in CI through a real Docker engine). The harness is stopped
// (SIGSTOP) again and again until it is caught between the two lines,
// then interrupted and let go.
func TestAnInterruptNeverSplitsAStep(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	session, work := filepath.Join(dir, "session"), filepath.Join(dir, "work")
	script := filepath.Join(dir, "harness.sh")
	if err := os.WriteFile(script, []byte(scriptText()), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", script, session, work)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "FAKE_CHILD=0", "FAKE_OWN_SESSION=0", "FAKE_DAEMON=0", "FAKE_UNTAGGED=0",
		"FAKE_STEPS=1000000", "FAKE_STEP_S=0"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	// Every signal goes through a pidfd taken while the harness cannot
	// have been reaped, so none reaches a process that got its pid later.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	signal := func(sig unix.Signal) error { return unix.PidfdSendSignal(pidfd, sig, nil, 0) }
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		// Through the pidfd os/exec holds, never by a bare pid or group
		// once the harness may have been reaped (another test's process
		// may have its number). Its one child, a "sleep 0", ends by itself.
		cmd.Process.Kill()
		err := <-done
		done <- err
	})
	lines := func(path string) int {
		data, _ := os.ReadFile(path)
		return strings.Count(string(data), "\n")
	}
	caught := false
	for try := 0; try < 100000 && !caught; try++ {
		if err := signal(unix.SIGSTOP); err != nil {
			t.Fatalf("stop the harness: %v", err)
		}
		for {
			st, ok := proctest.ReadStat(pid)
			if !ok || st.State == 'T' {
				break
			}
		}
		s, p := lines(filepath.Join(session, "steps")), lines(filepath.Join(work, "progress"))
		if s == p+1 {
			caught = true
			signal(unix.SIGINT) // pending while it is stopped
		} else if s != p {
			t.Fatalf("the session holds %d steps and progress %d lines", s, p)
		}
		signal(unix.SIGCONT)
	}
	if !caught {
		t.Fatal("the harness was never caught between a step's two lines")
	}
	err = <-done
	done <- err
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("the interrupted harness ended with %v, want exit 130", err)
	}
	if s, p := lines(filepath.Join(session, "steps")), lines(filepath.Join(work, "progress")); s != p {
		t.Errorf("after the interrupt the session holds %d steps and progress %d lines: a step was split", s, p)
	}
}
