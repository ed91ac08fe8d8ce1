package model

// End-to-end tests with real OpenCode (installed by
// scripts/install-opencode.sh into .tools/, ignored by git) against the fake
// server, fully offline: the configuration and environment are those the
// README's OpenCode section states.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// openCodeVersion is the OpenCode these tests run.
const openCodeVersion = "1.17.11"

// openCodeBin is the installed OpenCode binary. Missing, it fails the test
// under CI and skips it elsewhere, naming the install script.
func openCodeBin(t *testing.T) string {
	t.Helper()
	return installedBin(t, "real OpenCode "+openCodeVersion,
		filepath.Join("opencode-"+openCodeVersion, "node_modules", "opencode-linux-"+npmArch(), "bin", "opencode"),
		"scripts/install-opencode.sh "+openCodeVersion, true)
}

// startOpenCode starts `opencode run --format json <prompt>` against srv,
// with a scratch HOME and XDG folders and the local-only environment.
func startOpenCode(t *testing.T, bin string, srv *Server) *cliRun {
	t.Helper()
	sub := scratch(t, "work", "home", "tmp", "data", "config", "cache", "state")
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
	return startCLI(t, "opencode", bin, []string{"run", "--format", "json", prompt}, sub("work"), []string{
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
	})
}

// checkEvents checks OpenCode's JSON events: one JSON object a line, every
// one naming the same session, a completed bash tool use whose output holds
// the marker, and the final text.
func checkOpenCodeEvents(t *testing.T, r *cliRun) {
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
	deadline := time.Now().Add(cliLimit)
	run := startOpenCode(t, bin, srv)
	run.wait(t, deadline, srv)
	checkRequests(t, srv)
	checkOpenCodeEvents(t, run)
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
	deadline := time.Now().Add(cliLimit)
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
	checkOpenCodeEvents(t, run)
}
