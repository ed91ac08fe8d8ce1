package codexe2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// TestNgdriverRunCodex: the path a user takes by hand, `ngdriver run
// --adapter codex --harness-bin CODEX --model-url URL` (the static binary,
// the adapter table's codex entry, its section filled from the flags),
// with a checkpoint while Codex's tool runs and a crash of the driver after
// it: the rollout ends with reward 1, the relaunch after the restore
// starts over (Codex cannot continue without an added turn) and says why,
// and no model request carries a user turn the task did not have.
func TestNgdriverRunCodex(t *testing.T) {
	t.Parallel()
	bin := codexBin(t)
	srv := fakemodel.New(fakemodel.Options{Script: script("sleep 20; touch done.txt", "touch done.txt")})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	state, err := os.MkdirTemp("", suite.RunTag+"-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(suite.BinDir, "ngdriver-linux-"+runtime.GOARCH), "run",
		"--adapter", "codex", "--harness-bin", bin, "--model-url", srv.URL(),
		"--task", task, "--check", check, "--rollout-id", suite.RunTag+"-cli",
		"--checkpoint-at", "3s", "--crash-at", "6s", "--state-dir", state)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ngdriver run: %v\n%s", err, stderr.String())
	}
	var res struct {
		Reward   float64 `json:"reward"`
		Launches []struct {
			Resumed bool   `json:"resumed"`
			Reason  string `json:"reason"`
			Outcome string `json:"outcome"`
		} `json:"ng_harness_launches"`
		Response struct {
			Object string `json:"object"`
		} `json:"response"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("ngdriver run printed %q: %v", stdout.String(), err)
	}
	if res.Reward != 1 || res.Response.Object != "response" || len(res.Launches) < 2 {
		t.Errorf("result: reward %v, response object %q, launches %+v; want reward 1, a NeMoGymResponse, a relaunch after the crash\n%s",
			res.Reward, res.Response.Object, res.Launches, stderr.String())
	}
	if !strings.Contains(stderr.String(), "crash: the driver is abandoned") {
		t.Errorf("no crash in the log:\n%s", stderr.String())
	}
	reqs := srv.Requests()
	for _, q := range reqs {
		if u := userTurns(q); len(u) != 1 || u[0] != task {
			t.Errorf("request %s: user turns %.120q, want the task alone", harnesstest.DescribeRequest(q), u)
		}
	}
	last := res.Launches[len(res.Launches)-1]
	if last.Resumed || !strings.Contains(last.Reason, "starting over with the task in a fresh CODEX_HOME") {
		t.Errorf("the last launch: resumed %v, reason %q; want a fresh start saying why", last.Resumed, last.Reason)
	}
	t.Logf("reward %v in %d launches; the last resumed %v: %q; %d model requests", res.Reward, len(res.Launches), last.Resumed, last.Reason, len(reqs))
}
