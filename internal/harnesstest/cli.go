package harnesstest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/testkit"
)

// CLIRun is what one `ngdriver run` of a real harness left: its result,
// its log, and the model requests it made.
type CLIRun struct {
	// Reward and Launches are the result's reward and ng_harness_launches.
	Reward   float64
	Launches []struct {
		Resumed bool   `json:"resumed"`
		Reason  string `json:"reason"`
		Outcome string `json:"outcome"`
	}
	// ResponseObject is the result's response.object ("response" for a
	// NeMoGymResponse).
	ResponseObject string
	// Log is what ngdriver printed on stderr.
	Log string
	// Requests are the fake model's requests.
	Requests []fakemodel.Request
}

// CLITimes are when `ngdriver run` opens its checkpoint and crashes the
// driver (e.g. "3s", "6s"): chosen so that the harness's tool runs at both
// on a quiet machine; on a loaded one the run may take another path (a
// fresh start), which the launch log says and the test logs.
type CLITimes struct{ CheckpointAt, CrashAt string }

// NgdriverRun runs the suite's static ngdriver (Binaries must hold
// "ngdriver") as a user would by hand: `ngdriver run --adapter adapter
// --harness-bin bin --model-url <a fake model answering with script>`
// with the task and check, a checkpoint and a crash of the driver at
// times, local sandboxes in a folder of the run's tag. It fails the test unless the run exits 0 with
// reward 1, a NeMoGymResponse, a relaunch after the crash, and the crash
// in its log (what the model got is the caller's to check). The run's
// process group is killed if the test ends first; what it left in its
// sandboxes is the suite's last look.
func (s *Suite) NgdriverRun(t *testing.T, adapter, bin string, script func(fakemodel.Request) fakemodel.Reply, task, check string, times CLITimes) CLIRun {
	t.Helper()
	srv := fakemodel.New(fakemodel.Options{Script: script})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	state, err := os.MkdirTemp("", s.RunTag+"-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	ctx, cancel := context.WithTimeout(t.Context(), s.Patience)
	defer cancel()
	cmd := exec.CommandContext(ctx, testkit.Bin("ngdriver"), "run",
		"--adapter", adapter, "--harness-bin", bin, "--model-url", srv.URL(),
		"--task", task, "--check", check, "--rollout-id", s.RunTag+"-cli",
		"--checkpoint-at", times.CheckpointAt, "--crash-at", times.CrashAt, "--state-dir", state)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ngdriver run: %v\n%s", err, stderr.String())
	}
	var out CLIRun
	var res struct {
		Reward   float64         `json:"reward"`
		Launches json.RawMessage `json:"ng_harness_launches"`
		Response struct {
			Object string `json:"object"`
		} `json:"response"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("ngdriver run printed %q: %v", stdout.String(), err)
	}
	if err := json.Unmarshal(res.Launches, &out.Launches); err != nil {
		t.Fatalf("ngdriver run's ng_harness_launches: %v\n%s", err, stdout.String())
	}
	out.Reward, out.ResponseObject, out.Log, out.Requests = res.Reward, res.Response.Object, stderr.String(), srv.Requests()
	if out.Reward != 1 || out.ResponseObject != "response" || len(out.Launches) < 2 {
		t.Errorf("result: reward %v, response object %q, launches %+v; want reward 1, a NeMoGymResponse, a relaunch after the crash\n%s",
			out.Reward, out.ResponseObject, out.Launches, out.Log)
	}
	if !strings.Contains(out.Log, "crash: the driver is abandoned") {
		t.Errorf("no crash in the log:\n%s", out.Log)
	}
	return out
}

// CheckNoRepeats checks the run's model requests with check (a suite's
// repeat check): all of them together when the last launch continued the
// saved session, else each attempt's alone. A fresh start after the crash
// sends the task's first request again, by design: that is a new attempt,
// not a call repeated within one.
func (r CLIRun) CheckNoRepeats(t *testing.T, check func(*testing.T, []fakemodel.Request)) {
	t.Helper()
	if n := len(r.Launches); n > 0 && r.Launches[n-1].Resumed {
		check(t, r.Requests)
		return
	}
	byAttempt := map[int][]fakemodel.Request{}
	for _, q := range r.Requests {
		byAttempt[q.Attempt] = append(byAttempt[q.Attempt], q)
	}
	for _, reqs := range byAttempt {
		check(t, reqs)
	}
}
