package pi

// Tests of the launcher with real Pi (installed by
// scripts/install-harnesses.sh into .tools/) and real node, on the host,
// against internal/fake/model on chat completions: what the adapter's Launch
// returns is run as ngsup would run it (its argv, its environment, its
// folder), without a sandbox. Each run is tagged (proto.TagEnv) and every
// process carrying its tag, the tool calls Pi starts in sessions of their
// own included, is killed by pidfd when the test ends.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/hosttest"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

const (
	// piVersion is the Pi these tests run (pinned in
	// scripts/install-harnesses.sh).
	piVersion = "0.73.1"
)

// piCLI is the installed pi command (PI_BIN if set); missing, the test
// fails if CI is set and skips otherwise, naming the install script.
func piCLI(t *testing.T) string {
	t.Helper()
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return harnesstest.Installed(t, "Pi "+piVersion, "PI_BIN",
		filepath.Join(root, ".tools", "pi-"+piVersion, "node_modules", ".bin", "pi"), "scripts/install-harnesses.sh pi")
}

// rig is one test's Pi adapter on a host sandbox, its fake model and the
// tag of its runs.
type rig struct {
	t     *testing.T
	a     *Adapter
	sb    *hosttest.Sandbox
	lent  harness.LentSandbox
	model *fakemodel.Server
	tag   string
	state json.RawMessage
}

// newRig makes the rig: a fake model with opt, the adapter pointed at it,
// a fresh state. Its cleanup kills every process of its tag.
func newRig(t *testing.T, opt fakemodel.Options) *rig {
	t.Helper()
	pi := piCLI(t)
	node, err := exec.LookPath("node")
	if err != nil {
		msg := fmt.Sprintf("no node on PATH (Pi runs on it): %v", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg) // CI installs node with the harnesses: a missing one is a failure
		}
		t.Skip(msg)
	}
	model := fakemodel.New(opt)
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(model.Close)
	a, sb, lent := newAdapter(t, Options{Pi: pi, Node: node, CLIOptions: harness.CLIOptions{ModelURL: model.URL(), APIKey: "k"}})
	r := &rig{t: t, a: a, sb: sb, lent: lent, model: model, tag: fmt.Sprintf("pitest-%d-%s", os.Getpid(), t.Name())}
	r.state, err = a.NewState("r1", 1, lent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range r.procs() {
			harnesstest.KillIdentified(p)
		}
	})
	return r
}

// procs are the live processes of the rig's runs.
func (r *rig) procs() []harnesstest.ProcInfo {
	return harnesstest.Leftovers(func(p harnesstest.ProcInfo) bool { return p.Tag == r.tag })
}

// run is one launch running on the host.
type run struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	code           int // the exit code, or 128+signal
}

// launch runs what the adapter's Launch returns for attempt (a resume if
// resume): start(spec).
func (r *rig) launch(attempt int, resume bool, task string) *run {
	r.t.Helper()
	return r.start(r.spec(attempt, resume, task))
}

// spec is what the adapter's Launch returns for attempt (a resume if
// resume).
func (r *rig) spec(attempt int, resume bool, task string) harness.LaunchSpec {
	r.t.Helper()
	body, _ := json.Marshal(map[string]string{"task": task})
	spec, err := r.a.Launch(context.Background(), harness.LaunchContext{RolloutID: "r1", Attempt: attempt, Input: body, Sandbox: r.lent,
		State: r.state, Resume: resume, LaunchID: fmt.Sprintf("l%d", attempt)})
	if err != nil {
		r.t.Fatal(err)
	}
	return spec
}

// start runs spec as ngsup would: its argv in its folder, the environment
// plus its variables and the rig's tag, in a process group of its own,
// stdin /dev/null.
func (r *rig) start(spec harness.LaunchSpec) *run {
	r.t.Helper()
	h := &run{done: make(chan struct{})}
	h.cmd = exec.Command(spec.Argv[0], spec.Argv[1:]...)
	h.cmd.Dir = spec.Dir
	h.cmd.Env = append(os.Environ(), proto.TagEnv+"="+r.tag)
	for k, v := range spec.Env {
		h.cmd.Env = append(h.cmd.Env, k+"="+v)
	}
	h.cmd.Stdout, h.cmd.Stderr = &h.stdout, &h.stderr
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := h.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	go func() {
		defer close(h.done)
		err := h.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee) && ee.ExitCode() >= 0:
			h.code = ee.ExitCode()
		case errors.As(err, &ee):
			h.code = 128 + int(ee.Sys().(syscall.WaitStatus).Signal())
		default:
			h.code = -1
		}
	}()
	r.t.Cleanup(func() { _ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL); <-h.done })
	return h
}

// wait waits for the run to end and returns its exit code.
func (r *rig) wait(h *run) int {
	r.t.Helper()
	select {
	case <-h.done:
		return h.code
	case <-time.After(testkit.Patience):
		r.t.Fatalf("the launcher did not end within %s; stderr %s", testkit.Patience, h.stderr.String())
		return 0
	}
}

// crash kills the launcher (SIGKILL, its process group: a crash, nothing
// recorded) and then the tools it left running (as ngsup's stop of the
// crashed launch would), and waits until none is left.
func (r *rig) crash(h *run) {
	r.t.Helper()
	_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
	r.wait(h)
	for _, p := range r.procs() {
		harnesstest.KillIdentified(p)
	}
	testkit.Eventually(r.t, "no process of the crashed launch", func() (bool, string) {
		left := r.procs()
		return len(left) == 0, harnesstest.DescribeAll(left)
	})
}

// session is the rig's saved session file and its content ("" if none).
func (r *rig) session() (string, []byte) {
	files, _ := filepath.Glob(filepath.Join(stateOf(r.t, r.state).Home, "sessions", "*.jsonl"))
	if len(files) != 1 {
		return "", nil
	}
	data, _ := os.ReadFile(files[0])
	return files[0], data
}

// waitSession waits until the saved session's chain ends with a message
// that has.
func (r *rig) waitSession(what string, has func(Message) bool) {
	r.t.Helper()
	testkit.Eventually(r.t, "the session ending with "+what, func() (bool, string) {
		_, data := r.session()
		s, err := ParseSession(data)
		if err != nil || len(s.Messages) == 0 {
			return false, fmt.Sprintf("%d bytes (%v)", len(data), err)
		}
		last := s.Messages[len(s.Messages)-1]
		return has(last), fmt.Sprintf("last %s %q", last.Role, last.Text())
	})
}

// resume makes the rig's resume decision and checks it continues.
func (r *rig) resume(wantReason string) {
	r.t.Helper()
	d, err := r.a.ResumeDecision(context.Background(), r.lent, r.state, "r1", 2)
	if err != nil || !d.Resume || !strings.Contains(d.Reason, wantReason) {
		r.t.Fatalf("the decision: resume %v, reason %q (%v); want to continue, %q", d.Resume, d.Reason, err, wantReason)
	}
}

// toolThenDone is the script of these tests: a request whose last message
// is a tool result gets the final text "done"; any other the bash call
// cmd.
func toolThenDone(cmd string) func(fakemodel.Request) fakemodel.Reply {
	return func(q fakemodel.Request) fakemodel.Reply {
		if q.LastMessage().Role == "tool" {
			return fakemodel.Reply{Text: "done"}
		}
		return fakemodel.Reply{ToolCall: q.ShellCall(cmd)}
	}
}

// hostileTask is a task Pi's CLI would not pass on unchanged: a leading
// dash and a double dash (options), @path (a file include), a slash
// command, shell text, a NUL, leading and trailing whitespace (stdin is
// trimmed), text outside ASCII.
const hostileTask = "  -x -- @/etc/hostname /compact /skill:x 'q' \"dq\" $(touch pwned) `id` \x00\x01\r\n naïve 中文 🙂\n\n"

// TestLauncherSendsTheTask: the launcher's fresh run sends the task as the
// one user message, byte for byte (through the SDK: never an argument,
// never trimmed), runs the bash call, and ends with the model's answer:
// exit 0, two requests on the attempt's prefix, the session header first
// on stdout, the session saved with the task as its only user turn.
func TestLauncherSendsTheTask(t *testing.T) {
	r := newRig(t, fakemodel.Options{Script: toolThenDone("echo hello-from-tool")})
	h := r.launch(1, false, hostileTask)
	if code := r.wait(h); code != 0 {
		t.Fatalf("exit code %d; stderr %s", code, h.stderr.String())
	}
	reqs := r.model.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	for _, q := range reqs {
		var users [][]string
		for _, m := range q.Messages {
			if m.Role == "user" {
				users = append(users, m.Parts)
			}
		}
		if q.Path != "/ng-rollout/r1-a1/v1/chat/completions" || len(users) != 1 || len(users[0]) != 1 || users[0][0] != hostileTask {
			t.Errorf("request %s: user messages %q, want the task alone, byte for byte", q.Path, users)
		}
	}
	if last := reqs[1].LastMessage(); last.Role != "tool" || last.Content != "hello-from-tool\n" {
		t.Errorf("the second request ends with %s %q", last.Role, last.Content)
	}
	if !bytes.HasPrefix(h.stdout.Bytes(), []byte(`{"type":"session",`)) {
		t.Errorf("stdout starts %.100q", h.stdout.String())
	}
	_, data := r.session()
	s := parse(t, data)
	if u := s.UserTurns(); len(u) != 1 || u[0] != hostileTask || s.FinalText() != "done" || s.Cwd != r.lent.Workdir() {
		t.Errorf("the session: user turns %q, final %q, cwd %s", u, s.FinalText(), s.Cwd)
	}
}

// TestLauncherContinuesMidTool: Pi is killed while its bash call runs (the
// saved session ends with the call; its tool left running is killed too).
// The resume decision continues the session; the launcher saves Pi's own
// error result for the call and continues: its one request is, byte for
// byte, the request that made the call with exactly two messages added to
// its messages array, the call and the error result "No result provided"
// (every other byte the same, the system prompt and the task among them).
// The model answers, the launcher exits 0, and the session holds the task
// as its only user turn, the call, the saved error result and the answer.
func TestLauncherContinuesMidTool(t *testing.T) {
	r := newRig(t, fakemodel.Options{Script: toolThenDone("sleep 600")})
	h := r.launch(1, false, sampleTask)
	r.waitSession("the bash call", func(m Message) bool { return m.StopReason == "toolUse" })
	testkit.Eventually(r.t, "the tool's sleep", func() (bool, string) {
		for _, p := range r.procs() {
			if p.Stat.Comm == "sleep" {
				return true, ""
			}
		}
		return false, harnesstest.DescribeAll(r.procs())
	})
	r.crash(h)
	r.resume(`sending the interrupted tool call with Pi's own error result "No result provided" (no turn added)`)

	h2 := r.launch(2, true, "")
	if code := r.wait(h2); code != 0 {
		t.Fatalf("the continue's exit code %d; stderr %s", code, h2.stderr.String())
	}
	reqs := r.model.Requests()
	if len(reqs) != 2 || reqs[1].Attempt != 2 {
		t.Fatalf("%d requests, want the call and the continue's one", len(reqs))
	}
	before, bodyBefore, err1 := reqs[0].SentMessages()
	after, bodyAfter, err2 := reqs[1].SentMessages()
	if err1 != nil || err2 != nil {
		t.Fatalf("the requests' messages: %v, %v", err1, err2)
	}
	if !bytes.Equal(bodyBefore, bodyAfter) {
		t.Errorf("the continue's request differs outside its messages:\n%s\n%s", bodyBefore, bodyAfter)
	}
	if len(after) != len(before)+2 {
		t.Fatalf("the continue sent %d messages, want the %d before and 2", len(after), len(before))
	}
	for i := range before {
		if !bytes.Equal(before[i], after[i]) {
			t.Errorf("message %d differs:\n%s\n%s", i, before[i], after[i])
		}
	}
	call := reqs[1].Messages[len(before)]
	res := reqs[1].Messages[len(before)+1]
	if call.Role != "assistant" || len(call.ToolCalls) != 1 || call.ToolCalls[0].Name != "bash" || !strings.Contains(call.ToolCalls[0].Arguments, "sleep 600") ||
		res.Role != "tool" || res.ToolCallID != call.ToolCalls[0].ID || res.Content != NoResultText {
		t.Errorf("the added messages: %+v, %+v", call, res)
	}
	t.Logf("added to the messages: %s,%s", after[len(before)], after[len(before)+1])
	_, data := r.session()
	s := parse(t, data)
	var roles []string
	for _, m := range s.Messages {
		roles = append(roles, m.Role)
	}
	if u := s.UserTurns(); len(u) != 1 || u[0] != sampleTask || !slices.Equal(roles, []string{"user", "assistant", "toolResult", "assistant"}) ||
		s.Messages[2].Text() != NoResultText || !s.Messages[2].IsError || s.FinalText() != "done" {
		t.Errorf("the session after the continue: user turns %q, roles %q, result %+v", u, roles, s.Messages[2])
	}
}

// TestLauncherContinuesAfterTool: Pi is killed while the model's answer to
// the tool's result is held (the saved session ends with the result). The
// continue adds nothing: its one request is byte for byte the request that
// was in flight at the crash; the model answers and the launcher exits 0.
func TestLauncherContinuesAfterTool(t *testing.T) {
	r := newRig(t, fakemodel.Options{Script: toolThenDone("echo hello-from-tool"),
		Holdable: func(q fakemodel.Request) bool { return q.LastMessage().Role == "tool" }})
	r.model.Hold(1)
	defer r.model.Release() // the request of the killed launcher, whose client is gone
	h := r.launch(1, false, sampleTask)
	testkit.Eventually(r.t, "the held answer", func() (bool, string) { return r.model.Held() == 1, fmt.Sprintf("%d held", r.model.Held()) })
	// Pi saves a tool result before it sends the request that carries it.
	r.waitSession("the tool result", func(m Message) bool { return m.Role == "toolResult" })
	r.crash(h)
	r.resume("sending the saved tool results whose answer never came (no turn added)")

	h2 := r.launch(2, true, "")
	if code := r.wait(h2); code != 0 {
		t.Fatalf("the continue's exit code %d; stderr %s", code, h2.stderr.String())
	}
	reqs := r.model.Requests()
	if len(reqs) != 3 || reqs[2].Attempt != 2 {
		t.Fatalf("%d requests, want the call, the held one and the continue's one", len(reqs))
	}
	if !bytes.Equal(reqs[1].Body, reqs[2].Body) {
		t.Errorf("the continue's request is not the one in flight at the crash:\n%s\n%s", reqs[1].Body, reqs[2].Body)
	}
	t.Logf("the continue's one request is the %d bytes in flight at the crash", len(reqs[2].Body))
}

// TestLauncherStopKillsTheTools: SIGINT (how every stop begins) or
// SIGTERM to the launcher alone while Pi's bash call runs `sleep 600`:
// the launcher kills the tool's process group (in a session of its own,
// out of the launcher's group) and exits 130 or 143, recording nothing:
// the session still ends with the call. Pi's own print mode leaves the
// tool running on SIGINT.
func TestLauncherStopKillsTheTools(t *testing.T) {
	for _, c := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		t.Run(c.sig.String(), func(t *testing.T) {
			r := newRig(t, fakemodel.Options{Script: toolThenDone("sleep 600")})
			h := r.launch(1, false, sampleTask)
			testkit.Eventually(r.t, "the tool's sleep", func() (bool, string) {
				for _, p := range r.procs() {
					if p.Stat.Comm == "sleep" {
						return true, ""
					}
				}
				return false, harnesstest.DescribeAll(r.procs())
			})
			_, saved := r.session()
			if err := h.cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			if code := r.wait(h); code != c.code {
				t.Errorf("exit code %d, want %d; stderr %s", code, c.code, h.stderr.String())
			}
			testkit.Eventually(r.t, "no tool left", func() (bool, string) {
				left := r.procs()
				return len(left) == 0, harnesstest.DescribeAll(left)
			})
			if _, data := r.session(); !bytes.Equal(data, saved) {
				t.Errorf("the session changed on %s:\n%s", c.sig, data[len(saved):])
			}
		})
	}
}

// TestLauncherRefusesAnotherSession: a continue whose session file no
// longer ends where the adapter read it, or is gone (Pi would silently
// start an empty session there), exits 2 saying so, and sends nothing.
func TestLauncherRefusesAnotherSession(t *testing.T) {
	r := newRig(t, fakemodel.Options{Script: toolThenDone("true")})
	lines := bytes.SplitAfter(sample(t, "done.jsonl", 0), []byte{'\n'})
	f := saveSession(t, stateOf(t, r.state), sampleTask, inWorkdir(bytes.Join(lines[:5], nil), r.sb))
	spec := r.spec(2, true, "")
	if err := os.WriteFile(f, inWorkdir(bytes.Join(lines[:6], nil), r.sb), 0o600); err != nil {
		t.Fatal(err)
	}
	h := r.start(spec)
	if code := r.wait(h); code != 2 || !strings.Contains(h.stderr.String(), "ends at entry 2e6768f2, not b35feccd") {
		t.Errorf("a session that moved on: exit code %d, stderr %q", code, h.stderr.String())
	}
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	h = r.start(spec)
	if code := r.wait(h); code != 2 || !strings.Contains(h.stderr.String(), "does not exist") {
		t.Errorf("a session that is gone: exit code %d, stderr %q", code, h.stderr.String())
	}
	if _, err := os.Stat(f); err == nil {
		t.Errorf("the launcher made a session at %s", f)
	}
	if n := len(r.model.Requests()); n != 0 {
		t.Errorf("%d model requests", n)
	}
}

// TestLauncherContinuesAfterFailedCall: the model server goes away while
// the answer to the tool's result is held: Pi's call fails (retries off),
// it saves the failed reply, and the launcher exits 1 saying so (Pi's own
// --mode json exits 0 then). The resume decision continues the session,
// leaving the failed reply out as Pi's own retry does; with the server
// back, the continue's one request is byte for byte the one that failed,
// and the run ends with the model's answer.
func TestLauncherContinuesAfterFailedCall(t *testing.T) {
	held := func(q fakemodel.Request) bool { return q.LastMessage().Role == "tool" }
	r := newRig(t, fakemodel.Options{Script: toolThenDone("echo hello-from-tool"), Holdable: held})
	r.model.Hold(1)
	h := r.launch(1, false, sampleTask)
	testkit.Eventually(r.t, "the held answer", func() (bool, string) { return r.model.Held() == 1, fmt.Sprintf("%d held", r.model.Held()) })
	first := r.model
	addr := strings.TrimPrefix(first.URL(), "http://")
	first.Close() // the held request's connection is cut
	if code := r.wait(h); code != 1 || !strings.Contains(h.stderr.String(), "the model call ended in error") {
		t.Fatalf("exit code %d, stderr %q; want 1 and the failed call named", code, h.stderr.String())
	}
	r.waitSession("the failed reply", Message.Failed)
	r.resume("sending the saved tool results whose answer never came (the 1 failed reply after it left out, as Pi's own retry does) (no turn added)")

	r.model = fakemodel.New(fakemodel.Options{Script: toolThenDone("echo hello-from-tool"), Addr: addr})
	if err := r.model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.model.Close)
	h2 := r.launch(2, true, "")
	if code := r.wait(h2); code != 0 {
		t.Fatalf("the continue's exit code %d; stderr %s", code, h2.stderr.String())
	}
	failed, again := first.Requests(), r.model.Requests()
	if len(failed) != 2 || len(again) != 1 {
		t.Fatalf("%d requests, then %d; want the call and the failed one, then one", len(failed), len(again))
	}
	if !bytes.Equal(failed[1].Body, again[0].Body) {
		t.Errorf("the continue's request is not the one that failed:\n%s\n%s", failed[1].Body, again[0].Body)
	}
	_, data := r.session()
	if s := parse(t, data); s.FinalText() != "done" || len(s.UserTurns()) != 1 {
		t.Errorf("the session after the continue: final %q, user turns %q", s.FinalText(), s.UserTurns())
	}
}
