package model

// End-to-end test with real Claude Code (installed by
// scripts/install-harnesses.sh into .tools/, ignored by git) against the
// fake server on the Messages API, fully offline: flags and environment as
// in docs/claude.md.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// claudeVersion is the Claude Code this test runs (pinned in
// scripts/install-harnesses.sh).
const claudeVersion = "2.1.332"

// claudeBin is the installed Claude Code's native binary; missing, the
// test skips naming the install script.
func claudeBin(t *testing.T) string {
	t.Helper()
	return installedBin(t, "Claude Code "+claudeVersion,
		filepath.Join("claude-"+claudeVersion, "node_modules", "@anthropic-ai", "claude-code-linux-"+npmArch(), "claude"),
		"scripts/install-harnesses.sh claude", true)
}

// claudeRun is one `claude -p` run and its CLAUDE_CONFIG_DIR.
type claudeRun struct {
	*cliRun
	config string
}

// startClaude starts `claude -p <prompt> --output-format stream-json`
// against the fake at base, with a scratch HOME and CLAUDE_CONFIG_DIR and
// the local-only environment.
func startClaude(t *testing.T, bin, base string) claudeRun {
	t.Helper()
	sub := scratch(t, "work", "home", "claude", "tmp")
	run := startCLI(t, "claude", bin,
		[]string{"-p", prompt, "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions"},
		sub("work"), []string{
			"PATH=" + os.Getenv("PATH"),
			"HOME=" + sub("home"),
			"TMPDIR=" + sub("tmp"),
			"CLAUDE_CONFIG_DIR=" + sub("claude"),
			"ANTHROPIC_BASE_URL=" + base,
			"ANTHROPIC_API_KEY=dummy",
			"IS_SANDBOX=1", // root may bypass permissions only in a sandbox
			"DISABLE_TELEMETRY=1",
			"DISABLE_ERROR_REPORTING=1",
			"DISABLE_AUTOUPDATER=1",
			"DISABLE_BUG_COMMAND=1",
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		})
	return claudeRun{run, sub("claude")}
}

// TestClaudeRun: real Claude Code, offline, completes a single-tool run
// against DefaultScript on /v1/messages: it exits 0 after exactly two
// model requests (the Bash tool_use, the final answer), the second carrying
// the first's history, the call and the command's output as a tool result
// that is no error; its stream-json events name one session and end with a
// successful result "done", and the session file is in CLAUDE_CONFIG_DIR.
func TestClaudeRun(t *testing.T) {
	bin := claudeBin(t)
	srv := start(t, Options{Script: DefaultScript("echo " + toolMarker)})
	deadline := time.Now().Add(cliLimit)
	t0 := time.Now()
	run := startClaude(t, bin, srv.URL())
	run.wait(t, deadline, srv)
	t.Logf("claude ran %v", time.Since(t0).Round(time.Millisecond))

	checkToolRoundTrip(t, srv, APIMessages, "/v1/messages", "Bash")
	if r := srv.Requests()[0]; r.Header.Get("X-Api-Key") != "dummy" || !strings.Contains(string(r.Body), `"stream":true`) {
		t.Errorf("x-api-key %q, body streamed: %t", r.Header.Get("X-Api-Key"), strings.Contains(string(r.Body), `"stream":true`))
	}
	run.checkEvents(t)
}

// checkEvents checks Claude Code's stream-json events of one completed
// run: one session id, one successful result "done"; and the session's
// file in CLAUDE_CONFIG_DIR.
func (run claudeRun) checkEvents(t *testing.T) {
	t.Helper()

	var sessions []string
	var result struct {
		Subtype string `json:"subtype"`
		IsError bool   `json:"is_error"`
		Result  string `json:"result"`
	}
	results := 0
	for _, ev := range run.jsonLines(t) {
		var typ, session string
		json.Unmarshal(ev["type"], &typ)
		json.Unmarshal(ev["session_id"], &session)
		if session != "" && !strings.Contains(strings.Join(sessions, " "), session) {
			sessions = append(sessions, session)
		}
		if typ == "result" {
			results++
			data, _ := json.Marshal(ev)
			json.Unmarshal(data, &result)
		}
	}
	if len(sessions) != 1 {
		t.Errorf("session ids %q, want one", sessions)
	}
	if results != 1 || result.Subtype != "success" || result.IsError || result.Result != DefaultFinal {
		t.Errorf("%d results, the last %+v; want one success %q", results, result, DefaultFinal)
	}
	if len(sessions) == 1 {
		files, _ := filepath.Glob(filepath.Join(run.config, "projects", "*", sessions[0]+".jsonl"))
		if len(files) != 1 {
			t.Errorf("session files of %s: %q", sessions[0], files)
		}
	}
}

// TestClaudeHeldAndSlow: under a rollout prefix, with its first model
// request held, real Claude Code waits (no exit, no other request) for as
// long as the hold lasts; released, it reads both replies streamed slowly
// (Pace) and finishes the run normally.
func TestClaudeHeldAndSlow(t *testing.T) {
	bin := claudeBin(t)
	srv := start(t, Options{Script: slowly(DefaultScript("echo "+toolMarker), 50*time.Millisecond)})
	srv.Hold(1)
	deadline := time.Now().Add(cliLimit)
	run := startClaude(t, bin, srv.URL()+"/ng-rollout/r1-a2")
	holdThenRelease(t, srv, run.cliRun, deadline)
	run.wait(t, deadline, srv)
	checkToolRoundTrip(t, srv, APIMessages, "/ng-rollout/r1-a2/v1/messages", "Bash")
	run.checkEvents(t)
}
