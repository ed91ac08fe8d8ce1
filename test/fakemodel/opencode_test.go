package fakemodel

// End-to-end tests with real OpenCode (installed by
// scripts/install-opencode.sh into .tools/, ignored by git) against the fake
// server, fully offline: the configuration and environment are those of
// /work/shared/notes/opencode-offline.md.

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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// openCodeVersion is the OpenCode these tests run.
	openCodeVersion = "1.17.11"
	// openCodeLimit bounds one OpenCode run.
	openCodeLimit = 120 * time.Second
	// toolMarker is what the scripted tool call prints.
	toolMarker = "hello-from-tool"
	// prompt is the task, passed as one argv element.
	prompt = "say hi then run the tool"
)

// openCodeBin is the installed OpenCode binary. Missing, it fails the test
// under CI and skips it elsewhere, naming the install script.
func openCodeBin(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := wd
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Fatalf("no go.mod above %s", wd)
		}
		root = parent
	}
	arch := "x64"
	if runtime.GOARCH == "arm64" {
		arch = "arm64"
	}
	bin := filepath.Join(root, ".tools", "opencode-"+openCodeVersion, "node_modules", "opencode-linux-"+arch, "bin", "opencode")
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		msg := fmt.Sprintf("real OpenCode %s is not installed at %s (%v): run scripts/install-opencode.sh %s", openCodeVersion, bin, err, openCodeVersion)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// openCodeRun is one `opencode run` in its own process group.
type openCodeRun struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
	done   chan struct{} // closed when it has exited
	err    error         // its exit, once done
}

// startOpenCode starts `opencode run --format json <prompt>` against srv,
// with a scratch HOME and XDG folders, the local-only environment, and a
// process group of its own that the test's cleanup kills if it still runs.
func startOpenCode(t *testing.T, bin string, srv *Server) *openCodeRun {
	t.Helper()
	dir := t.TempDir()
	sub := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	config, err := json.Marshal(map[string]any{
		"model": "fake/fake-model", "small_model": "fake/fake-model",
		"autoupdate": false, "share": "disabled", "enabled_providers": []string{"fake"},
		"permission": "allow",
		"provider": map[string]any{"fake": map[string]any{
			"npm": "@ai-sdk/openai-compatible", "name": "Fake",
			"options": map[string]any{"baseURL": srv.URL() + "/v1", "apiKey": "x"},
			"models": map[string]any{"fake-model": map[string]any{
				"name": "Fake", "tool_call": true,
				"limit": map[string]any{"context": 128000, "output": 4096},
			}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &openCodeRun{done: make(chan struct{})}
	r.cmd = exec.Command(bin, "run", "--format", "json", prompt)
	r.cmd.Dir = sub("work")
	r.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + sub("home"),
		"TMPDIR=" + sub("tmp"),
		"XDG_DATA_HOME=" + sub("data"),
		"XDG_CONFIG_HOME=" + sub("config"),
		"XDG_CACHE_HOME=" + sub("cache"),
		"XDG_STATE_HOME=" + sub("state"),
		"OPENCODE_CONFIG_CONTENT=" + string(config),
		"OPENCODE_DISABLE_MODELS_FETCH=1",
		"OPENCODE_DISABLE_AUTOUPDATE=1",
		"OPENCODE_DISABLE_SHARE=1",
		"OPENCODE_DISABLE_LSP_DOWNLOAD=1",
		"OPENCODE_DISABLE_DEFAULT_PLUGINS=1",
		"OPENCODE_DISABLE_CLAUDE_CODE=1",
		"OPENCODE_DISABLE_EXTERNAL_SKILLS=1",
		"npm_config_registry=http://127.0.0.1:9/",
	}
	r.cmd.Stdout = &r.stdout
	r.cmd.Stderr = &r.stderr
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.cmd.WaitDelay = 5 * time.Second // the output pipes must not outlive it
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("started opencode pid %d (its own process group)", r.cmd.Process.Pid)
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

func (r *openCodeRun) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// kill kills OpenCode's process group, and the tool processes it started
// in process groups of their own (found through /proc before the kill,
// while they are still its descendants).
func (r *openCodeRun) kill(t *testing.T) {
	pid := r.cmd.Process.Pid
	desc := descendants(pid)
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill process group %d: %v", pid, err)
	}
	for _, d := range desc {
		if err := syscall.Kill(d, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("kill %d (started under opencode %d): %v", d, pid, err)
		}
	}
	t.Logf("killed opencode process group %d and its descendants %v", pid, desc)
}

// descendants lists the processes below pid, from /proc.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(fields[1]); err == nil {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// wait waits for OpenCode to exit before deadline; past it, it kills it and
// fails the test.
func (r *openCodeRun) wait(t *testing.T, deadline time.Time, srv *Server) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(time.Until(deadline)):
		r.kill(t)
		<-r.done
		r.dump(t, srv)
		t.Fatalf("opencode did not finish within %v", openCodeLimit)
	}
	if r.err != nil {
		r.dump(t, srv)
		t.Fatalf("opencode: %v", r.err)
	}
}

// dump logs what helps to see why a run failed.
func (r *openCodeRun) dump(t *testing.T, srv *Server) {
	t.Helper()
	t.Logf("opencode stdout:\n%s", r.stdout.Bytes())
	stderr := r.stderr.String()
	if len(stderr) > 8000 {
		stderr = "..." + stderr[len(stderr)-8000:]
	}
	t.Logf("opencode stderr:\n%s", stderr)
	for i, req := range srv.Requests() {
		t.Logf("request %d: %s", i+1, req.summary())
	}
}

// checkEvents checks OpenCode's JSON events: one JSON object a line, every
// one naming the same session, a completed bash tool use whose output holds
// the marker, and the final text.
func (r *openCodeRun) checkEvents(t *testing.T) {
	t.Helper()
	var session string
	var toolOutput, texts []string
	sc := bufio.NewScanner(bytes.NewReader(r.stdout.Bytes()))
	sc.Buffer(nil, 16<<20)
	n := 0
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		n++
		var ev struct {
			Type      string `json:"type"`
			SessionID string `json:"sessionID"`
			Part      struct {
				Tool  string `json:"tool"`
				Text  string `json:"text"`
				State struct {
					Status string `json:"status"`
					Output string `json:"output"`
				} `json:"state"`
			} `json:"part"`
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Errorf("event %d is not JSON: %q: %v", n, line, err)
			continue
		}
		if ev.SessionID == "" || (session != "" && ev.SessionID != session) {
			t.Errorf("event %d: sessionID %q (first was %q): %s", n, ev.SessionID, session, line)
		}
		if session == "" {
			session = ev.SessionID
		}
		switch ev.Type {
		case "tool_use":
			if ev.Part.Tool == "bash" && ev.Part.State.Status == "completed" {
				toolOutput = append(toolOutput, ev.Part.State.Output)
			}
		case "text":
			texts = append(texts, ev.Part.Text)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 || session == "" {
		t.Fatalf("no JSON events with a sessionID on stdout")
	}
	if len(toolOutput) != 1 || !strings.Contains(toolOutput[0], toolMarker) {
		t.Errorf("completed bash tool outputs %q, want one holding %q", toolOutput, toolMarker)
	}
	if len(texts) == 0 || texts[len(texts)-1] != DefaultFinal {
		t.Errorf("texts %q, want the last %q", texts, DefaultFinal)
	}
	t.Logf("%d events, session %s", n, session)
}

// checkRequests checks the model requests of one completed single-tool run:
// three, all streamed on /v1/chat/completions: a title request with no
// tools, the main turn ending with the user's prompt (answered by the bash
// call), and the final request, last to arrive, whose history ends with that
// call and its tool message holding the marker.
func checkRequests(t *testing.T, srv *Server) {
	t.Helper()
	reqs := srv.Requests()
	for i, r := range reqs {
		t.Logf("request %d: %s", i+1, r.summary())
	}
	if len(reqs) != 3 {
		t.Fatalf("%d model requests, want 3 (title, tool call, final)", len(reqs))
	}
	var titles, mains []Request
	for _, r := range reqs {
		if r.Path != "/v1/chat/completions" || r.Rollout != "" || r.Model != "fake-model" || !r.Stream {
			t.Errorf("request %s: path, model or stream unexpected", r.summary())
		}
		if r.HasTools {
			mains = append(mains, r)
		} else {
			titles = append(titles, r)
		}
	}
	if len(titles) != 1 || len(mains) != 2 {
		t.Fatalf("%d requests without tools and %d with, want 1 and 2", len(titles), len(mains))
	}
	if last := titles[0].LastMessage(); last.Role != "user" || !strings.Contains(last.Content, prompt) {
		t.Errorf("title request ends with %+v", last)
	}
	if last := mains[0].LastMessage(); last.Role != "user" || !strings.Contains(last.Content, prompt) {
		t.Errorf("main turn ends with %+v", last)
	}
	final := mains[1]
	if reqs[2].Received != final.Received {
		t.Errorf("the final request was not the last to arrive")
	}
	n := len(final.Messages)
	if n < 2 {
		t.Fatalf("final request history %+v", final.Messages)
	}
	call, tool := final.Messages[n-2], final.Messages[n-1]
	if tool.Role != "tool" || !strings.Contains(tool.Content, toolMarker) {
		t.Errorf("final request ends with %+v, want a tool message holding %q", tool, toolMarker)
	}
	if call.Role != "assistant" || len(call.ToolCalls) != 1 || call.ToolCalls[0].Name != "bash" ||
		call.ToolCalls[0].ID != tool.ToolCallID || !strings.Contains(call.ToolCalls[0].Arguments, "echo "+toolMarker) {
		t.Errorf("final request's tool call %+v, answered by %q", call, tool.ToolCallID)
	}
}

// TestOpenCodeRun: real OpenCode, offline, completes a single-tool run
// against DefaultScript: it exits 0 after 3 model requests (title, tool
// call, final), the final history ends with the tool's output, and its JSON
// events carry one sessionID.
func TestOpenCodeRun(t *testing.T) {
	bin := openCodeBin(t)
	srv := start(t, Options{Script: DefaultScript("echo " + toolMarker)})
	deadline := time.Now().Add(openCodeLimit)
	run := startOpenCode(t, bin, srv)
	run.wait(t, deadline, srv)
	checkRequests(t, srv)
	run.checkEvents(t)
}

// TestOpenCodeHeld: with the main turn held, real OpenCode waits (it does not
// exit, nor send more requests) for as long as the hold lasts; once released
// it finishes the run normally.
func TestOpenCodeHeld(t *testing.T) {
	bin := openCodeBin(t)
	srv := start(t, Options{
		Script:   DefaultScript("echo " + toolMarker),
		Holdable: func(r Request) bool { return r.HasTools },
	})
	srv.Hold(1)
	deadline := time.Now().Add(openCodeLimit)
	run := startOpenCode(t, bin, srv)

	for srv.Held() == 0 {
		if run.exited() {
			run.dump(t, srv)
			t.Fatalf("opencode exited (%v) before its main turn was held", run.err)
		}
		if time.Now().After(deadline) {
			run.kill(t)
			<-run.done
			run.dump(t, srv)
			t.Fatal("the main turn never came")
		}
		time.Sleep(20 * time.Millisecond)
	}
	reqs := srv.Requests()
	held := reqs[len(reqs)-1]
	if !held.HasTools || held.LastMessage().Role != "user" {
		t.Fatalf("the held request is not the main turn: %s", held.summary())
	}

	const holdFor = 3 * time.Second
	select {
	case <-run.done:
		run.dump(t, srv)
		t.Fatalf("opencode exited (%v) while its main turn was held", run.err)
	case <-time.After(holdFor):
	}
	if n := srv.Held(); n != 1 {
		t.Fatalf("held %d after %v, want 1", n, holdFor)
	}
	for _, r := range srv.Requests() {
		if r.HasTools && r.Received != held.Received {
			t.Fatalf("a request with tools came while the main turn was held: %s", r.summary())
		}
	}
	t.Logf("opencode waited %v on the held main turn; releasing", holdFor)

	srv.Release()
	run.wait(t, deadline, srv)
	checkRequests(t, srv)
	run.checkEvents(t)
}
