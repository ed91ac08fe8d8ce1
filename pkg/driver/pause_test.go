package driver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/proto"
)

// allKinds are the processes a default fake harness records in its pids
// file: itself, a child, a command in a session of its own, a double-forked
// daemon and a child that cleared its environment.
var allKinds = []string{"harness", "child", "own_session", "daemon", "untagged"}

// pauseSteps gives a paused run room for two checkpoints before it ends.
const pauseSteps = 12

// checkAllStopped fails unless every process running in the sandbox, other
// than ngsup itself, is held (proctest.Held: stopped, or bound to stop
// before it runs again).
func checkAllStopped(t *testing.T, e *drivertest.Env, what, sandboxID string) {
	t.Helper()
	n := 0
	for _, pid := range e.ProcsIn(sandboxID) {
		if drivertest.IsSupervisor(pid) {
			continue
		}
		n++
		st, ok := proctest.ReadStat(pid)
		if !ok || st.State == 'Z' {
			continue
		}
		if held, why := proctest.Held(pid, st.StartTicks); !held {
			t.Errorf("%s: %s is not stopped: %s", what, proctest.Describe(pid), why)
		}
	}
	if n == 0 {
		t.Errorf("%s: no process of the launch found in the sandbox", what)
	}
}

// checkStill fails if anything in the sandbox's folder changes while the
// launch is held (a few step times).
func checkStill(t *testing.T, e *drivertest.Env, what, sandboxID string, stepS float64) {
	t.Helper()
	before := drivertest.Digest(t, e.HostPath(sandboxID))
	time.Sleep(time.Duration(4 * stepS * float64(time.Second)))
	if after := drivertest.Digest(t, e.HostPath(sandboxID)); after != before {
		t.Errorf("%s: the sandbox's files changed while its launch was paused", what)
	}
}

// TestPausedLaunchExportedAndContinuedInPlace proves that a paused launch is
// exported at its bookmark (Prepare's record: next=harness, resume=true,
// paused set, the launch record counting the pause), that every process of
// the launch is stopped and nothing in the sandbox changes while it is
// parked, that it continues in place after each of two checkpoints (the
// same processes run again), and that it is launched once: one launch
// record, pauses=2, finished, every step exactly once, reward 1.
func TestPausedLaunchExportedAndContinuedInPlace(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	ro := e.Rollout("pause-twice")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil), drivertest.Until{Steps: 2, Kinds: allKinds})

	for i, id := range []string{"ckpt-1", "ckpt-2"} {
		res := prepare(t, p, id)
		rec, bm := bookmarkOf(t, res.Records, ro)
		if rec.Attempt != 1 || bm.Next != driver.StageHarness || !bm.Resume || bm.Paused == nil || bm.Paused.SandboxID != run.SandboxID || !bm.Paused.Supervised {
			t.Fatalf("%s: the exported bookmark is not a paused harness step: %s", id, rec.Bookmark)
		}
		if len(bm.Launches) != 1 || bm.Launches[0].Pauses != i+1 || bm.Launches[0].ID != bm.Paused.ID {
			t.Fatalf("%s: the bookmark's launch record should count %d pauses of the one launch: %s", id, i+1, rec.Bookmark)
		}
		if got := e.SessionOf(run.SandboxID, bm.State); got != run.Session {
			t.Errorf("%s: the bookmark's state names session %s, the harness writes %s", id, got, run.Session)
		}
		if runs := p.Runs(); len(runs) != 1 || runs[0].State != "parked" {
			t.Errorf("%s: participant runs %+v, want the one run parked", id, runs)
		}
		checkHeld(t, id+": while parked", run.Procs)
		checkAllStopped(t, e, id+": while parked", run.SandboxID)
		held := drivertest.Steps(run.Session)
		checkStill(t, e, id, run.SandboxID, stepS)
		commit(t, e, p, id, false)
		resume(t, p, id)
		// The same processes go on: the steps grow and none was relaunched.
		testkit.Eventually(t, id+": the launch goes on", func() (bool, string) {
			got := drivertest.Steps(run.Session)
			return len(got) > len(held), "steps still " + itoa(len(got))
		})
		// Resume returns before the run's `ngsup continue` does, and the
		// harness's group is continued before the processes outside it:
		// the states are checked once that command has returned.
		testkit.Eventually(t, id+": ngsup continue returns", func() (bool, string) {
			n := len(e.Backend.Verbs("continue"))
			return n == i+1, itoa(n) + " continue commands returned"
		})
		checkStates(t, id+": after the resume", run.Procs, "SRD")
	}

	r := run.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 2, false)
	if r.Launches[0].ExitCode != 0 || !r.Launches[0].Supervised || r.Launches[0].SandboxID != run.SandboxID {
		t.Errorf("launch record %+v: want exit 0, supervised, in %s", r.Launches[0], run.SandboxID)
	}
	if r.Fake.Steps != pauseSteps || r.Fake.FirstStep != 1 {
		t.Errorf("harness output %+v: want every step in one launch", r.Fake)
	}
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, pauseSteps)
	if n := len(e.Backend.Verbs("run")); n != 1 {
		t.Errorf("ngsup run ran %d times, want once", n)
	}
	if n := len(e.Backend.Verbs("pause")); n != 2 {
		t.Errorf("ngsup pause ran %d times, want 2", n)
	}
	for _, x := range append(e.Backend.Verbs("pause"), e.Backend.Verbs("continue")...) {
		if x.Timeout != launch.ControlTimeout {
			t.Errorf("%v got a budget of %s, want %s", x.Argv, x.Timeout, launch.ControlTimeout)
		}
	}
	drivertest.CheckGone(t, "after verify", run.Procs)
	e.CheckNoProcs("after verify", run.SandboxID)
}

// TestCheckpointClosedBeforeTheRunWakes proves that a checkpoint that
// closes before the parked run wakes (Prepare, then Resume at once: no
// snapshot, no commit) finds the launch still paused, and the same launch
// continues and finishes: one launch, pauses=1.
func TestCheckpointClosedBeforeTheRunWakes(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("close-early")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 1, Kinds: allKinds})

	res := prepare(t, p, "ckpt-1")
	resume(t, p, "ckpt-1")
	if _, bm := bookmarkOf(t, res.Records, ro); bm.Paused == nil {
		t.Errorf("the prepare did not export a paused launch: %+v", bm)
	}
	r := run.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
	if n, c := len(e.Backend.Verbs("pause")), len(e.Backend.Verbs("continue")); n != 1 || c != 1 {
		t.Errorf("ngsup pause ran %d times and continue %d, want once each", n, c)
	}
	drivertest.CheckGone(t, "after verify", run.Procs)
}

// TestPausedTimeIsRecorded proves that each launch's entry in
// ng_harness_launches says how long it was held paused (paused_s, summed
// over its pauses): two checkpoints each held for a known time give at
// least their sum, and the launch's duration includes it.
func TestPausedTimeIsRecorded(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	ro := e.Rollout("paused-time")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil), drivertest.Until{Steps: 1})
	const hold = 700 * time.Millisecond
	for i, id := range []string{"ckpt-1", "ckpt-2"} {
		prepare(t, p, id)
		time.Sleep(hold)
		resume(t, p, id)
		testkit.Eventually(t, id+": ngsup continue returns", func() (bool, string) {
			n := len(e.Backend.Verbs("continue"))
			return n == i+1, itoa(n) + " continue commands returned"
		})
	}
	r := run.MustSucceed(t)
	var raw struct {
		Launches []map[string]any `json:"ng_harness_launches"`
	}
	if err := json.Unmarshal(r.Raw, &raw); err != nil || len(raw.Launches) != 1 {
		t.Fatalf("want one launch entry: %v %s", err, r.Raw)
	}
	l := raw.Launches[0]
	paused, ok := l["paused_s"].(float64)
	if want := 2 * hold.Seconds(); !ok || paused < want {
		t.Errorf("the launch entry's paused_s is %v, want at least %.1f (two holds of %s): %v", l["paused_s"], want, hold, l)
	}
	if d, _ := l["duration_s"].(float64); d < paused {
		t.Errorf("duration_s %v is less than paused_s %v", d, paused)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 2, false)
	checkVerified(t, e, ro, r)
}

// TestPausedUnsupervisedLaunch proves that a launch without a supervisor
// (tagged only: no `ngsup run`) is paused in place too: every process of it,
// found by its tag (and the untagged child as a descendant), is stopped
// while parked; continue resumes the same processes; one launch, pauses=1.
func TestPausedUnsupervisedLaunch(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	rn.Unsupervised = true
	ro := e.Rollout("pause-unsup")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 1, Kinds: allKinds})

	res := prepare(t, p, "ckpt-1")
	_, bm := bookmarkOf(t, res.Records, ro)
	if bm.Paused == nil || bm.Paused.Supervised {
		t.Errorf("want an unsupervised paused launch in the bookmark, got %+v", bm.Paused)
	}
	checkHeld(t, "while parked", run.Procs)
	checkAllStopped(t, e, "while parked", run.SandboxID)
	resume(t, p, "ckpt-1")

	r := run.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	if r.Launches[0].Supervised {
		t.Errorf("the launch record says supervised")
	}
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
	if n := len(e.Backend.Verbs("run")); n != 0 {
		t.Errorf("ngsup run ran %d times in an unsupervised run", n)
	}
	for _, x := range append(e.Backend.Verbs("pause"), e.Backend.Verbs("continue")...) {
		if x.Arg("--id") != r.Launches[0].ID {
			t.Errorf("%v: an unsupervised launch is named by --id", x.Argv)
		}
	}
	drivertest.CheckGone(t, "after verify", run.Procs)
	e.CheckNoProcs("after verify", run.SandboxID)
}

// TestLaunchEndedBeforeParkKeepsResult proves that a launch that ended
// before the park request keeps its result. The driver's `ngsup wait` is
// held (not run) until the harness has really ended (its receipt says so)
// and Prepare was called; the pause then answers exit 3 and nothing is
// relaunched: one launch, pauses 0, finished, verified.
func TestLaunchEndedBeforeParkKeepsResult(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	const n = 3
	rn := e.Runner(drivertest.Fake(n, 0.1), p)
	ro := e.Rollout("ended-early")
	held := make(chan struct{})
	var waits atomic.Int32
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "wait" && waits.Add(1) == 1 {
			close(held)
			<-ctx.Done() // held until the park request cancels the wait
			return execRes{ExitCode: -1}, ctx.Err()
		}
		return next(ctx, req)
	})
	h := e.Start(rn, ro, 1, drivertest.Task(ro, n, 0.1, nil))
	await(t, held, "the driver waits on the launch", h)
	sbID := e.Session(ro).SandboxID
	launchID := driver.LaunchID(ro, 1, 1, sbID)
	testkit.Eventually(t, "the harness has ended", func() (bool, string) {
		r := e.Receipt(sbID, launchID)
		return r != nil && r.Ended, "no ended receipt"
	})
	res := prepare(t, p, "ckpt-1")
	if hasRecord(res.Records, ro) {
		_, bm := bookmarkOf(t, res.Records, ro)
		if bm.Next != driver.StageVerify && bm.Next != driver.StageReturn {
			t.Errorf("the run was exported at %s, want verify or return (its launch had ended)", bm.Next)
		}
	}
	resume(t, p, "ckpt-1")
	r := h.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	checkVerified(t, e, ro, r)
	pauses := e.Backend.Verbs("pause")
	if len(pauses) != 1 || pauses[0].ExitCode != proto.ExitEnded {
		t.Errorf("want one pause answering %d (ended), got %+v", proto.ExitEnded, pauses)
	}
	if n := len(e.Backend.Verbs("run")); n != 1 {
		t.Errorf("ngsup run ran %d times, want once", n)
	}
	if c := len(e.Backend.Verbs("continue")); c != 0 {
		t.Errorf("ngsup continue ran %d times for a launch that was never paused", c)
	}
}

// TestCommitWithStopKillsPausedLaunch proves that a commit the controller
// stops after (stop: true) kills the launch a park left paused, once the
// records are written, and that the run relaunches on the saved session
// after the resume: two launches, the first interrupted with pauses=1, the
// second resumed; every step once; verified.
func TestCommitWithStopKillsPausedLaunch(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("commit-stop")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 2, Kinds: allKinds})

	prepare(t, p, "ckpt-1")
	commit(t, e, p, "ckpt-1", true)
	drivertest.CheckGone(t, "after a commit with stop", run.Procs)
	e.CheckNoProcs("after a commit with stop", run.SandboxID)
	resume(t, p, "ckpt-1")

	r := run.MustSucceed(t)
	if len(r.Launches) != 2 {
		t.Fatalf("want two launches, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeInterrupted, 1, false)
	drivertest.CheckLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
}

// TestContinueFailureStopsAndRelaunches proves the fallback when a paused
// launch cannot be continued (ngsup continue answers 4): the launch is
// stopped (every process of it gone) and the run relaunches on the saved
// session; verified, every step once.
func TestContinueFailureStopsAndRelaunches(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("continue-fails")
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "continue" {
			return execRes{ExitCode: proto.ExitNotConfirmed, Stdout: []byte(`{"continued":0,"skipped":0,"elapsed_ms":1,"method":"signal","pending":[{"pid":1,"state":"T"}]}` + "\n")}, nil
		}
		return next(ctx, req)
	})
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 2, Kinds: allKinds})
	prepare(t, p, "ckpt-1")
	resume(t, p, "ckpt-1")
	drivertest.CheckGone(t, "after a failed continue", run.Procs)

	r := run.MustSucceed(t)
	if len(r.Launches) != 2 {
		t.Fatalf("want two launches, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeInterrupted, 1, false)
	drivertest.CheckLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
}

// heldByPause reads the processes the last pause of a launch stopped (the
// launch folder's paused set) on the host.
func heldByPause(t *testing.T, launchDir string) []drivertest.Proc {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(launchDir, proto.PausedFile))
	if err != nil {
		t.Fatalf("the paused set of the launch: %v", err)
	}
	var out []drivertest.Proc
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var p drivertest.Proc
		if _, err := fmt.Sscanf(line, "%d %d", &p.PID, &p.StartTicks); err == nil && p.PID > 0 {
			p.Kind = "paused"
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		t.Fatalf("the paused set of the launch is empty: %q", data)
	}
	return out
}

// TestContinueThatFindsNothingRelaunches proves that a continue that finds
// none of the processes its pause held is a failure, never a success: the
// launch's processes are killed behind the driver's back while it is parked
// (each by pid, as another launch's stop once did), and when the checkpoint
// opens the driver warns naming the launch, records why, and relaunches on
// the saved session instead of following a dead launch to a failed verify.
func TestContinueThatFindsNothingRelaunches(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("continue-nothing")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 2, Kinds: allKinds})
	prepare(t, p, "ckpt-1")
	checkHeld(t, "while parked", run.Procs)
	// Every process the pause holds (its paused set, "pid start" lines),
	// each killed only if it is still the one recorded.
	held := heldByPause(t, e.LaunchDir(run.SandboxID, driver.LaunchID(ro, 1, 1, run.SandboxID)))
	for _, pr := range held {
		pr.Kill()
	}
	drivertest.CheckGone(t, "killed behind the driver's back", append(held, run.Procs...))
	// Reaped too: ngsup's continue counts a zombie it still finds in the
	// launch's tree as continued.
	testkit.Eventually(t, "the killed processes are reaped", func() (bool, string) {
		for _, pr := range held {
			if st, ok := proctest.ReadStat(pr.PID); ok && st.StartTicks == pr.StartTicks {
				return false, fmt.Sprintf("%d is still there in state %c", pr.PID, st.State)
			}
		}
		return true, ""
	})
	resume(t, p, "ckpt-1")

	r := run.MustSucceed(t)
	if len(r.Launches) != 2 {
		t.Fatalf("want two launches (the dead one, then a relaunch), got %+v", r.Launches)
	}
	first := r.Launches[0]
	drivertest.CheckLaunch(t, first, driver.OutcomeInterrupted, 1, false)
	if !contains(first.Error, "found none of the") {
		t.Errorf("the first launch's error %q does not say the continue found nothing", first.Error)
	}
	drivertest.CheckLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
	var warned bool
	for _, line := range strings.Split(e.Logs(), "\n") {
		if contains(line, "level=WARN") && contains(line, "could not be continued") && contains(line, first.ID) {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning naming launch %s says it could not be continued", first.ID)
	}
}

// TestUnconfirmedPauseFallsBackToStop proves that a pause ngsup cannot
// confirm (exit 4) falls back to the stop: the launch's processes are all
// gone while the run is parked, and it relaunches on the saved session after
// the resume; the first launch records why (pauses 0).
func TestUnconfirmedPauseFallsBackToStop(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("pause-unconfirmed")
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "pause" {
			return execRes{ExitCode: proto.ExitNotConfirmed, Stdout: []byte(`{"paused":false,"processes":0,"passes":3,"elapsed_ms":5000,"method":"signal","supervised":true,"pending":[{"pid":1,"state":"D","wchan":"io_schedule"}],"error":"1 process not stopped"}` + "\n")}, nil
		}
		return next(ctx, req)
	})
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 2, Kinds: allKinds})
	res := prepare(t, p, "ckpt-1")
	_, bm := bookmarkOf(t, res.Records, ro)
	if bm.Paused != nil || !bm.Resume || len(bm.Launches) != 1 || bm.Launches[0].Outcome != driver.OutcomeInterrupted {
		t.Errorf("want a bookmark that relaunches a stopped launch, got %+v", bm)
	}
	drivertest.CheckGone(t, "while parked after the fallback stop", run.Procs)
	e.CheckNoProcs("while parked after the fallback stop", run.SandboxID)
	resume(t, p, "ckpt-1")

	r := run.MustSucceed(t)
	if len(r.Launches) != 2 {
		t.Fatalf("want two launches, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeInterrupted, 0, false)
	if !contains(r.Launches[0].Error, "pause not confirmed") {
		t.Errorf("the first launch's error %q does not say the pause was not confirmed", r.Launches[0].Error)
	}
	drivertest.CheckLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
}

// TestEmptyPauseRetriedOnce proves that a pause that printed nothing within
// its budget is run once more, and that a second real pause holds the
// launch in place: one launch, pauses=1.
func TestEmptyPauseRetriedOnce(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("pause-empty-once")
	var pauses atomic.Int32
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "pause" && pauses.Add(1) == 1 {
			return execRes{ExitCode: 0}, nil
		}
		return next(ctx, req)
	})
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 1, Kinds: allKinds})
	prepare(t, p, "ckpt-1")
	checkHeld(t, "while parked", run.Procs)
	resume(t, p, "ckpt-1")
	r := run.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	if n := len(e.Backend.Verbs("pause")); n != 2 {
		t.Errorf("ngsup pause ran %d times, want 2 (the empty answer retried once)", n)
	}
	checkVerified(t, e, ro, r)
}

// TestPauseThatKeepsPrintingNothingStops proves that a pause that prints
// nothing twice is reported (the launch record says why) and the launch is
// stopped and relaunched on its saved session.
func TestPauseThatKeepsPrintingNothingStops(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("pause-empty")
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "pause" {
			return execRes{ExitCode: 0, Stderr: []byte("lost\n")}, nil
		}
		return next(ctx, req)
	})
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 1, Kinds: allKinds})
	prepare(t, p, "ckpt-1")
	drivertest.CheckGone(t, "while parked after the fallback stop", run.Procs)
	resume(t, p, "ckpt-1")
	r := run.MustSucceed(t)
	if len(r.Launches) != 2 {
		t.Fatalf("want two launches, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeInterrupted, 0, false)
	if !contains(r.Launches[0].Error, "printed nothing") {
		t.Errorf("the first launch's error %q does not say the pause printed nothing", r.Launches[0].Error)
	}
	if n := len(e.Backend.Verbs("pause")); n != 2 {
		t.Errorf("ngsup pause ran %d times, want 2", n)
	}
	drivertest.CheckLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
}

// TestCheckpointResumedWhileThePauseRuns proves that a checkpoint the
// controller closes while a run is still pausing (Resume during Prepare,
// before the run parked) finds the launch paused once the pause lands and
// lets it go on at once: the same launch continues and finishes (one
// launch, pauses=1), the in-flight Prepare does not later claim the closed
// checkpoint (it returns without a prepared export), and the participant is
// idle, so the next checkpoint can open.
func TestCheckpointResumedWhileThePauseRuns(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("resume-mid-pause")
	pausing, release := make(chan struct{}), make(chan struct{})
	var pauses atomic.Int32
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "pause" && pauses.Add(1) == 1 {
			close(pausing)
			<-release
		}
		return next(ctx, req)
	})
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 1, Kinds: allKinds})

	type prepareOutcome struct {
		rep *gym.PrepareReply
		err error
	}
	prepDone := make(chan prepareOutcome, 1)
	go func() {
		rep, err := p.Control().Prepare(context.Background(), request("ckpt-1"))
		prepDone <- prepareOutcome{rep, err}
	}()
	await(t, pausing, "the pause", run.Handle)
	resume(t, p, "ckpt-1")
	close(release)

	r := run.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
	drivertest.CheckGone(t, "after verify", run.Procs)
	select {
	case got := <-prepDone:
		if got.err == nil && got.rep.Phase == gym.PhasePrepared {
			t.Errorf("the prepare of the closed checkpoint claimed every run parked")
		}
	case <-time.After(drivertest.Patience):
		t.Fatalf("the prepare of a resumed checkpoint never returned")
	}
	if ph := p.Control().Status().Phase; ph != gym.PhaseIdle {
		t.Errorf("phase %s after the checkpoint was resumed, want idle", ph)
	}
	if rep, err := p.Control().Prepare(context.Background(), request("ckpt-2")); err != nil || rep.Phase != gym.PhasePrepared {
		t.Errorf("the next checkpoint cannot open: %+v, %v", rep, err)
	} else {
		resume(t, p, "ckpt-2")
	}
}

// TestSupervisorCannotStartFallsBackToTagged proves the seed's fallback:
// when ngsup cannot start as the supervisor (here its `run` exits 1 as if
// the sandbox refused it), the harness still runs, tagged only; the launch
// record says unsupervised, a checkpoint pauses it by its tag (--id) and
// it continues in place, and the run is verified.
func TestSupervisorCannotStartFallsBackToTagged(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	e.Backend.SetHook(func(ctx context.Context, sb sandbox.Sandbox, req sandbox.ExecRequest, next drivertest.Next) (sandbox.ExecResult, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "run" {
			return sandbox.ExecResult{ExitCode: 1, Stderr: []byte("ngsup: become child subreaper: operation not permitted\n")}, nil
		}
		return next(ctx, req)
	})
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("fallback")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 1, Kinds: allKinds})

	prepare(t, p, "ckpt-1")
	checkHeld(t, "while parked", run.Procs)
	resume(t, p, "ckpt-1")

	r := run.MustSucceed(t)
	if len(r.Launches) != 1 || r.Launches[0].Supervised {
		t.Fatalf("want one unsupervised launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
	for _, x := range e.Backend.Verbs("pause") {
		if x.Arg("--id") != r.Launches[0].ID {
			t.Errorf("%v: the fallback launch is paused by its tag (--id)", x.Argv)
		}
	}
}

// TestPauseDoesNotWaitForTheCancelledWait proves that a run asked to park
// starts its pause without waiting for the `ngsup wait` it cancelled to
// return (at a checkpoint of hundreds of runs, killing and reaping the
// waits took a median 0.8 s before the first pause). The cancelled wait's
// exec is held, as a slow reap would hold it, until the launch's pause
// command has started (or 20 s, after which the test fails): the pause must
// start while it is held, and the launch is still paused, exported, and
// continued in place to a verified end, every step once.
func TestPauseDoesNotWaitForTheCancelledWait(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	ro := e.Rollout("pause-first")
	pauseStarted := make(chan struct{})
	var pauseOnce sync.Once
	var heldWaits, waitFirst atomic.Int32
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) < 2 || !drivertest.IsNgsup(req.Argv[0]) {
			return next(ctx, req)
		}
		switch req.Argv[1] {
		case "pause":
			pauseOnce.Do(func() { close(pauseStarted) })
		case "wait":
			res, err := next(ctx, req)
			if ctx.Err() != nil && heldWaits.Add(1) == 1 {
				select {
				case <-pauseStarted:
				case <-time.After(20 * time.Second):
					waitFirst.Store(1)
				}
			}
			return res, err
		}
		return next(ctx, req)
	})
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil), drivertest.Until{Steps: 1, Kinds: allKinds})

	res := prepare(t, p, "ckpt-1")
	if waitFirst.Load() != 0 {
		t.Errorf("the pause started only after the cancelled ngsup wait had returned")
	}
	if _, bm := bookmarkOf(t, res.Records, ro); bm.Paused == nil {
		t.Errorf("want the launch exported paused")
	}
	checkHeld(t, "while parked", run.Procs)
	resume(t, p, "ckpt-1")
	r := run.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, pauseSteps)
	e.CheckNoProcs("after verify", run.SandboxID)
}
