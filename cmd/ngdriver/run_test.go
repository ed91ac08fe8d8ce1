package main

import (
	"encoding/json"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver/config"
)

// TestRunPicksAUniqueRolloutID proves that two `ngdriver run` started
// without --rollout-id do not share a rollout id (they once both used
// demo-1, and so the same launch ids): each run body gets a new id.
func TestRunPicksAUniqueRolloutID(t *testing.T) {
	c := newRunCmd()
	if err := c.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	def := c.Flags().Lookup("rollout-id").DefValue
	ids := map[string]bool{}
	for i := 0; i < 2; i++ {
		body, err := buildBody(runFlags{rollout: def, adapter: "fake", steps: 2})
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			RolloutID string `json:"rollout_id"`
		}
		if err := json.Unmarshal(body, &meta); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(meta.RolloutID, "run-") {
			t.Errorf("the default rollout id is %q, want a new run-<time>-<random> id", meta.RolloutID)
		}
		ids[meta.RolloutID] = true
	}
	if len(ids) != 2 {
		t.Errorf("two runs without --rollout-id got the same rollout id: %v", ids)
	}
}

// runFlagsOf parses args as `ngdriver run` would.
func runFlagsOf(t *testing.T, args ...string) runFlags {
	t.Helper()
	c, f := runCmd()
	if err := c.ParseFlags(args); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return *f
}

// ngsupDirWithResume is a folder holding what the opencode adapter looks
// for at build (ngresume binaries; never run here).
func ngsupDirWithResume(t *testing.T) string {
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		if err := os.WriteFile(filepath.Join(dir, "ngresume-linux-"+arch), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRunBuildsEveryAdapter: `ngdriver run --adapter NAME` builds every
// adapter of the table from its generic flags alone: --harness-bin fills
// that adapter's own binary key and --model-url its model_url.
func TestRunBuildsEveryAdapter(t *testing.T) {
	dir := ngsupDirWithResume(t)
	for name, a := range adapters {
		args := []string{"--adapter", name}
		if a.keys.Binary != "" {
			args = append(args, "--harness-bin", "/opt/harness")
		}
		if a.keys.Model {
			args = append(args, "--model-url", "http://127.0.0.1:8000")
		}
		sec, err := runSection(runFlagsOf(t, args...))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if a.keys.Binary != "" && sec[a.keys.Binary] != "/opt/harness" {
			t.Errorf("%s: --harness-bin did not fill %s: %v", name, a.keys.Binary, sec)
		}
		got, err := buildAdapter(config.Config{Adapter: name, NgsupDir: dir, Sections: map[string]map[string]any{name: sec}})
		if err != nil || got.Name() != name {
			t.Errorf("%s from %q: built %v, %v", name, args, got, err)
		}
	}
}

// TestRunSection: the run flags become the chosen adapter's section
// (--opencode still names opencode's binary, --set values are YAML typed
// and win), and flags that do not fit the adapter are refused naming it.
func TestRunSection(t *testing.T) {
	sec, err := runSection(runFlagsOf(t, "--adapter", "codex", "--harness-bin", "/opt/codex", "--model-url", "http://x:1",
		"--model", "m", "--set", "timeout=1h", "--set", "resume_prompt=Continue.", "--set", "model=n"))
	want := map[string]any{"codex": "/opt/codex", "model_url": "http://x:1", "model": "n", "timeout": "1h", "resume_prompt": "Continue."}
	if err != nil || !maps.Equal(sec, want) {
		t.Errorf("codex: %v, %v; want %v", sec, err, want)
	}
	sec, err = runSection(runFlagsOf(t, "--adapter", "opencode", "--opencode", "/opt/oc", "--model-url", "http://x:1",
		"--set", "context_window=8192", "--set", "pause_at_checkpoints=false"))
	want = map[string]any{"opencode": "/opt/oc", "model_url": "http://x:1", "context_window": 8192, "pause_at_checkpoints": false}
	if err != nil || !maps.Equal(sec, want) {
		t.Errorf("opencode: %v, %v; want %v", sec, err, want)
	}
	for _, c := range []struct {
		args  []string
		words []string
	}{
		{[]string{"--adapter", "fake", "--model-url", "http://x:1"}, []string{"--model-url", "fake", "no model server"}},
		{[]string{"--adapter", "fake", "--harness-bin", "/x"}, []string{"--harness-bin", "fake"}},
		{[]string{"--adapter", "codex", "--set", "timeout"}, []string{"--set", "timeout", "KEY=VALUE"}},
		{[]string{"--adapter", "nope"}, []string{"nope", "codex, fake, opencode"}},
	} {
		_, err := runSection(runFlagsOf(t, c.args...))
		for _, w := range c.words {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want an error naming %q", c.args, err, w)
			}
		}
	}
	sec, err = runSection(runFlagsOf(t, "--adapter", "codex", "--harness-bin", "/x", "--model-url", "http://x:1", "--set", "modle=m"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := buildAdapter(config.Config{Adapter: "codex", Sections: map[string]map[string]any{"codex": sec}}); err == nil || !strings.Contains(err.Error(), "modle") {
		t.Errorf("--set of a key codex does not have: %v, want an error naming it", err)
	}
}

// TestServersListenOnLoopbackByDefault (issue 18, finding 1): where nothing
// names an address, `serve` and `owner serve` listen on loopback only, so
// no other host (and, where sandboxes have a network of their own, no
// sandbox) reaches them unless the operator says so.
func TestServersListenOnLoopbackByDefault(t *testing.T) {
	for what, addr := range map[string]string{"serve (config.Default)": config.Default().Listen, "owner serve": defaultOwnerListen} {
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("%s listens on %q by default, want a loopback address", what, addr)
		}
	}
}
