package model

// The kit the end-to-end tests with real harnesses share: finding an
// installed harness in .tools/, and running it in a process group of its
// own that the test kills (with the tool processes it started in sessions
// of their own) if it still runs when the test ends.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
)

const (
	// cliLimit bounds one harness run.
	cliLimit = 120 * time.Second
	// toolMarker is what the scripted tool call prints.
	toolMarker = "hello-from-tool"
	// prompt is the task, passed as one argv element.
	prompt = "say hi then run the tool"
)

// npmArch is the architecture as npm platform packages name it.
func npmArch() string {
	if runtime.GOARCH == "arm64" {
		return "arm64"
	}
	return "x64"
}

// installedBin is the harness binary at rel below the repository's .tools/.
// Missing, it skips the test with one line naming the install command, or
// fails it under CI if requireInCI.
func installedBin(t *testing.T, what, rel, install string, requireInCI bool) string {
	t.Helper()
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, ".tools", rel)
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		msg := fmt.Sprintf("%s is not installed at %s: run %s", what, bin, install)
		if requireInCI && os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// scratch makes the named folders below a fresh temporary folder and
// returns a function giving each one's path.
func scratch(t *testing.T, names ...string) func(string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.MkdirAll(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return func(name string) string { return filepath.Join(dir, name) }
}

// cliRun is one harness process in its own process group.
type cliRun struct {
	name   string
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{} // closed when it has exited
	err    error         // its exit, once done
}

// startCLI starts bin with args in dir, with exactly env as its
// environment, stdin /dev/null, and a process group of its own that the
// test's cleanup kills if it still runs.
func startCLI(t *testing.T, name, bin string, args []string, dir string, env []string) *cliRun {
	t.Helper()
	r := &cliRun{name: name, done: make(chan struct{})}
	r.cmd = exec.Command(bin, args...)
	r.cmd.Dir = dir
	r.cmd.Env = env
	r.cmd.Stdout = &r.stdout
	r.cmd.Stderr = &r.stderr
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.cmd.WaitDelay = 5 * time.Second // the output pipes must not outlive it
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("started %s pid %d (its own process group)", name, r.cmd.Process.Pid)
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		if r.exited() {
			return
		}
		r.kill(t)
		<-r.done
	})
	return r
}

func (r *cliRun) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// kill kills the harness's process group, and the tool processes it
// started in process groups of their own (found through /proc before the
// kill, while they are still its descendants).
func (r *cliRun) kill(t *testing.T) {
	pid := r.cmd.Process.Pid
	desc := proctest.Descendants(pid)
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill process group %d: %v", pid, err)
	}
	for _, d := range desc {
		if err := syscall.Kill(d, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("kill %d (started under %s %d): %v", d, r.name, pid, err)
		}
	}
	t.Logf("killed %s process group %d and its descendants %v", r.name, pid, desc)
}

// wait waits for the harness to exit before deadline; past it, it kills it
// and fails the test. It fails the test too if the exit is not 0.
func (r *cliRun) wait(t *testing.T, deadline time.Time, srv *Server) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(time.Until(deadline)):
		r.kill(t)
		<-r.done
		r.dump(t, srv)
		t.Fatalf("%s did not finish within %v", r.name, cliLimit)
	}
	if r.err != nil {
		r.dump(t, srv)
		t.Fatalf("%s: %v", r.name, r.err)
	}
}

// dump logs what helps to see why a run failed.
func (r *cliRun) dump(t *testing.T, srv *Server) {
	t.Helper()
	t.Logf("%s stdout:\n%s", r.name, r.stdout.Bytes())
	stderr := r.stderr.String()
	if len(stderr) > 8000 {
		stderr = "..." + stderr[len(stderr)-8000:]
	}
	t.Logf("%s stderr:\n%s", r.name, stderr)
	for i, req := range srv.Requests() {
		t.Logf("request %d: %s", i+1, req.summary())
	}
}

// jsonLines decodes stdout as one JSON object a line (blank lines skipped),
// failing the test on a line that is not one.
func (r *cliRun) jsonLines(t *testing.T) []map[string]json.RawMessage {
	t.Helper()
	var out []map[string]json.RawMessage
	sc := bufio.NewScanner(bytes.NewReader(r.stdout.Bytes()))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev map[string]json.RawMessage
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Errorf("%s event %d is not a JSON object: %q: %v", r.name, len(out)+1, line, err)
			continue
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s printed no JSON events", r.name)
	}
	return out
}

// checkToolRoundTrip checks the model requests of one completed
// single-tool run of a harness that makes no side requests: two, both
// streamed on api's route with a tool offered; the first ends with the
// prompt as a user turn (one text part, byte for byte) and is answered by
// the shell call; the second carries the first's history unchanged, then
// that call (name shell) and its result holding the marker, not an error.
func checkToolRoundTrip(t *testing.T, srv *Server, api, path, shell string) {
	t.Helper()
	reqs := srv.Requests()
	for i, r := range reqs {
		t.Logf("request %d: %s", i+1, r.summary())
	}
	if len(reqs) != 2 {
		t.Fatalf("%d model requests, want 2 (tool call, final)", len(reqs))
	}
	for _, r := range reqs {
		if r.API != api || r.Path != path || !r.Stream || !r.HasTools {
			t.Errorf("request %s: API, path, stream or tools unexpected", r.summary())
		}
	}
	first, final := reqs[0], reqs[1]
	turn := -1
	for i, m := range first.Messages {
		if m.Role == "user" && slices.Contains(m.Parts, prompt) {
			turn = i
		}
	}
	if turn < 0 {
		t.Errorf("no user turn of the first request has the prompt as a part: %s", first.HistoryKey())
	}
	for _, m := range first.Messages[turn+1:] {
		if m.Role != "system" { // Claude Code puts its environment after the prompt
			t.Errorf("the first request goes on after the prompt with %+v", m)
		}
	}
	n := len(first.Messages)
	if len(final.Messages) != n+2 || mustJSON(t, final.Messages[:n]) != first.HistoryKey() {
		t.Fatalf("the final history is not the first one plus a call and its result:\nfirst %s\nfinal %s", first.HistoryKey(), final.HistoryKey())
	}
	call, tool := final.Messages[n], final.Messages[n+1]
	if call.Role != "assistant" || len(call.ToolCalls) != 1 || call.ToolCalls[0].Name != shell ||
		!strings.Contains(call.ToolCalls[0].Arguments, "echo "+toolMarker) || call.ToolCalls[0].ID != tool.ToolCallID {
		t.Errorf("the final request's tool call %+v, answered by %q", call, tool.ToolCallID)
	}
	if tool.Role != "tool" || tool.IsError || !strings.Contains(tool.Content, toolMarker) {
		t.Errorf("the final request ends with %+v, want a tool result holding %q", tool, toolMarker)
	}
}

// slowly is script with every reply streamed at pace.
func slowly(script func(Request) Reply, pace time.Duration) func(Request) Reply {
	return func(r Request) Reply {
		reply := script(r)
		reply.Pace = pace
		return reply
	}
}

// holdFor is how long the held-reply tests keep a harness waiting.
const holdFor = 3 * time.Second

// holdThenRelease waits for the harness's first model request to be held
// (srv.Hold(1) before it started), checks that for holdFor the harness
// neither exits nor sends another request, then releases it.
func holdThenRelease(t *testing.T, srv *Server, run *cliRun, deadline time.Time) {
	t.Helper()
	for srv.Held() == 0 {
		if run.exited() {
			run.dump(t, srv)
			t.Fatalf("%s exited (%v) before its request was held", run.name, run.err)
		}
		if time.Now().After(deadline) {
			run.kill(t)
			<-run.done
			run.dump(t, srv)
			t.Fatalf("%s sent no model request", run.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-run.done:
		run.dump(t, srv)
		t.Fatalf("%s exited (%v) while its request was held", run.name, run.err)
	case <-time.After(holdFor):
	}
	if n, got := srv.Held(), len(srv.Requests()); n != 1 || got != 1 {
		run.dump(t, srv)
		t.Fatalf("after %v: %d held, %d requests; want 1 and 1", holdFor, n, got)
	}
	t.Logf("%s waited %v on its held request; releasing", run.name, holdFor)
	srv.Release()
}
