package model

// End-to-end test with the real Codex CLI (installed by
// scripts/install-harnesses.sh into .tools/, ignored by git) against the
// fake server on the Responses API, fully offline: configuration and
// environment as docs/codex.md states them.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// codexVersion is the Codex CLI this test runs (pinned in
// scripts/install-harnesses.sh).
const codexVersion = "0.171.0"

// codexKeyVar is the environment variable the fake provider's key is read
// from.
const codexKeyVar = "NG_FAKE_MODEL_KEY"

// codexBin is the installed Codex CLI's native binary; missing, the test
// skips naming the install script.
func codexBin(t *testing.T) string {
	t.Helper()
	triple := "x86_64-unknown-linux-musl"
	if npmArch() == "arm64" {
		triple = "aarch64-unknown-linux-musl"
	}
	return installedBin(t, "Codex CLI "+codexVersion,
		filepath.Join("codex-"+codexVersion, "node_modules", "@openai", "codex-linux-"+npmArch(), "vendor", triple, "bin", "codex"),
		"scripts/install-harnesses.sh codex", true)
}

// codexConfig is $CODEX_HOME/config.toml pointing Codex at the Responses
// API below base (the fake's URL, maybe with a rollout prefix) with every
// call home turned off.
func codexConfig(base string) string {
	return `model = "fake-model"
model_provider = "fake"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.fake]
name = "fake"
base_url = "` + base + `/v1"
env_key = "` + codexKeyVar + `"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false
`
}

// codexRun is one `codex exec` run and its CODEX_HOME.
type codexRun struct {
	*cliRun
	home string
}

// startCodex starts `codex exec --json <prompt>` against the fake at base,
// with a scratch HOME and CODEX_HOME.
func startCodex(t *testing.T, bin, base string) codexRun {
	t.Helper()
	sub := scratch(t, "work", "home", "codex", "tmp")
	if err := os.WriteFile(filepath.Join(sub("codex"), "config.toml"), []byte(codexConfig(base)), 0o644); err != nil {
		t.Fatal(err)
	}
	run := startCLI(t, "codex", bin,
		[]string{"exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt},
		sub("work"), []string{
			"PATH=" + os.Getenv("PATH"),
			"HOME=" + sub("home"),
			"TMPDIR=" + sub("tmp"),
			"CODEX_HOME=" + sub("codex"),
			codexKeyVar + "=dummy",
		})
	return codexRun{run, sub("codex")}
}

// TestCodexRun: the real Codex CLI, offline, completes a single-tool run
// against DefaultScript on /v1/responses: it exits 0 after exactly two
// model requests (the exec_command call, the final answer), the second
// carrying the first's history, the call and the command's output; its
// JSON events show the command completed with the marker and the final
// message "done", and its session file is in CODEX_HOME.
func TestCodexRun(t *testing.T) {
	bin := codexBin(t)
	srv := start(t, Options{Script: DefaultScript("echo " + toolMarker)})
	deadline := time.Now().Add(cliLimit)
	t0 := time.Now()
	run := startCodex(t, bin, srv.URL())
	run.wait(t, deadline, srv)
	t.Logf("codex ran %v", time.Since(t0).Round(time.Millisecond))

	checkToolRoundTrip(t, srv, APIResponses, "/v1/responses", "exec_command")
	if auth := srv.Requests()[0].Header.Get("Authorization"); auth != "Bearer dummy" {
		t.Errorf("Authorization %q", auth)
	}
	run.checkEvents(t)
}

// checkEvents checks Codex's JSON events of one completed single-tool
// run: a thread, one command completed with exit code 0 and the marker in
// its output, the one agent message "done", the turn completed; and the
// thread's session file in CODEX_HOME.
func (run codexRun) checkEvents(t *testing.T) {
	t.Helper()

	var thread string
	var outputs, messages []string
	completed := false
	for _, ev := range run.jsonLines(t) {
		var typ string
		json.Unmarshal(ev["type"], &typ)
		switch typ {
		case "thread.started":
			json.Unmarshal(ev["thread_id"], &thread)
		case "item.completed":
			var item struct {
				Type             string `json:"type"`
				Text             string `json:"text"`
				AggregatedOutput string `json:"aggregated_output"`
				ExitCode         *int   `json:"exit_code"`
			}
			json.Unmarshal(ev["item"], &item)
			switch item.Type {
			case "command_execution":
				if item.ExitCode != nil && *item.ExitCode == 0 {
					outputs = append(outputs, item.AggregatedOutput)
				}
			case "agent_message":
				messages = append(messages, item.Text)
			}
		case "turn.completed":
			completed = true
		}
	}
	if thread == "" || !completed {
		t.Errorf("thread %q, turn completed %t", thread, completed)
	}
	if len(outputs) != 1 || !strings.Contains(outputs[0], toolMarker) {
		t.Errorf("completed commands' outputs %q, want one holding %q", outputs, toolMarker)
	}
	if len(messages) != 1 || messages[0] != DefaultFinal {
		t.Errorf("agent messages %q, want [%q]", messages, DefaultFinal)
	}
	sessions, _ := filepath.Glob(filepath.Join(run.home, "sessions", "*", "*", "*", "rollout-*-"+thread+".jsonl"))
	if len(sessions) != 1 {
		t.Errorf("session files of thread %s: %q", thread, sessions)
	}
}

// TestCodexHeldAndSlow: under a rollout prefix, with its first model
// request held, the real Codex CLI waits (no exit, no other request) for
// as long as the hold lasts; released, it reads both replies streamed
// slowly (Pace) and finishes the run normally.
func TestCodexHeldAndSlow(t *testing.T) {
	bin := codexBin(t)
	srv := start(t, Options{Script: slowly(DefaultScript("echo "+toolMarker), 50*time.Millisecond)})
	srv.Hold(1)
	deadline := time.Now().Add(cliLimit)
	run := startCodex(t, bin, srv.URL()+"/ng-rollout/r1-a2")
	holdThenRelease(t, srv, run.cliRun, deadline)
	run.wait(t, deadline, srv)
	checkToolRoundTrip(t, srv, APIResponses, "/ng-rollout/r1-a2/v1/responses", "exec_command")
	run.checkEvents(t)
	if r := srv.Requests()[1]; r.Rollout != "r1-a2" || r.Attempt != 2 {
		t.Errorf("rollout %q attempt %d", r.Rollout, r.Attempt)
	}
}
