package driver_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestPausedBookmarkRelaunchesAfterCrash proves that the exported bookmark
// of a paused launch relaunches on the saved session after a crash. A
// checkpoint pauses the launch, the owner snapshots it and the participant
// commits; the run goes on and then crashes (cancelled with ErrCrashed):
// nothing is cleaned up (its session stays open, its processes run, no stop
// or close is issued). The owner restores (forking the snapshot under a new
// sandbox id, ending the old sandbox's processes), a new Participant
// restores the records, and attempt 2 relaunches in the fork: two launches,
// the second resumed with the adapter's reason in the new sandbox; the
// saved session holds each step exactly once; verified.
func TestPausedBookmarkRelaunchesAfterCrash(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("crash")
	body := drivertest.Task(ro, steps, stepS, nil)
	p1 := drivertest.NewParticipant()
	run1 := e.StartRunning(e.Runner(drivertest.Fake(steps, stepS), p1), ro, 1, body, drivertest.Until{Steps: 2, Kinds: allKinds})

	prepare(t, p1, "ckpt-1")
	saved := drivertest.Steps(run1.Session) // what the snapshot holds
	recs := commit(t, e, p1, "ckpt-1", false)
	rec, bm := bookmarkOf(t, recs, ro)
	if bm.Next != driver.StageHarness || bm.Paused == nil || !bm.Resume {
		t.Fatalf("the committed record is not a paused harness bookmark: %s", rec.Bookmark)
	}
	resume(t, p1, "ckpt-1")
	e.WaitSteps(run1.Session, len(saved)+1) // the launch went on after the checkpoint

	run1.Cancel(driver.ErrCrashed)
	if _, err := run1.Wait(t); !errors.Is(err, driver.ErrCrashed) {
		t.Fatalf("the crashed run1 returned %v, want ErrCrashed", err)
	}
	// A crash cleans nothing up.
	if s := e.Session(ro); s.Closed || s.SandboxID != run1.SandboxID {
		t.Errorf("after the crash the session is %+v, want it open on %s", s, run1.SandboxID)
	}
	if live := drivertest.Live(run1.Procs); len(live) != len(run1.Procs) {
		t.Errorf("the crash ended processes of the launch: alive %v of %v", live, run1.Procs)
	}
	if n := len(e.Backend.Verbs("stop")); n != 0 {
		t.Errorf("the crashed run1 ran ngsup stop %d times", n)
	}
	if n := e.Owner.Count(drivertest.CallClose, ro); n != 0 {
		t.Errorf("the crashed run1 closed its session")
	}

	restoreOwner(t, e, "ckpt-1", recs)
	drivertest.CheckGone(t, "after the owner's restore (the replaced sandbox is stopped)", run1.Procs)
	sb1 := e.Session(ro).SandboxID
	if sb1 == run1.SandboxID {
		t.Fatalf("the restore did not fork under a new sandbox id (%s)", sb1)
	}
	p2 := drivertest.NewParticipant()
	restore(t, e, p2, "ckpt-1", recs)
	r := e.Start(e.Runner(drivertest.Fake(steps, stepS), p2), ro, 2, body).MustSucceed(t)

	if len(r.Launches) != 2 {
		t.Fatalf("want two launches, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeInterrupted, 1, false)
	drivertest.CheckLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
	if r.Launches[0].SandboxID != run1.SandboxID || r.Launches[1].SandboxID != sb1 {
		t.Errorf("launches ran in %s and %s, want %s then the fork %s", r.Launches[0].SandboxID, r.Launches[1].SandboxID, run1.SandboxID, sb1)
	}
	if want := fmt.Sprintf("the saved session holds %d completed steps", len(saved)); r.Launches[1].Reason != want {
		t.Errorf("the relaunch's reason is %q, want the adapter's %q", r.Launches[1].Reason, want)
	}
	if r.Launches[1].ID != driver.LaunchID(ro, 2, 2, sb1) {
		t.Errorf("the relaunch is %s, want launch 2 of attempt 2", r.Launches[1].ID)
	}
	if r.Fake.FirstStep != len(saved)+1 || r.Fake.Steps != steps {
		t.Errorf("harness output %+v: want the relaunch to go on from step %d", r.Fake, len(saved)+1)
	}
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, e.SessionOf(sb1, bm.State), steps)
	e.CheckNoProcs("after verify")
	if got := goneLines(e.Logs()); len(got) != 1 || !contains(got[0], "relaunching on its saved session") {
		t.Errorf("want one line saying the paused launch is gone and the relaunch continues its session, got %q", got)
	}
}

// goneLines are the log lines about a paused launch a crash took.
func goneLines(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if contains(l, "the paused launch is gone") {
			out = append(out, l)
		}
	}
	return out
}

// TestGonePausedLaunchLogsWhatTheRelaunchDoes proves that the line about a
// paused launch a crash took says what the relaunch really does, once: here
// the fork's saved session holds no completed step (its steps file is
// removed before attempt 2), so the relaunch starts over, and nothing says
// it continues the saved session.
func TestGonePausedLaunchLogsWhatTheRelaunchDoes(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("crash-fresh")
	body := drivertest.Task(ro, steps, stepS, nil)
	p1 := drivertest.NewParticipant()
	run1 := e.StartRunning(e.Runner(drivertest.Fake(steps, stepS), p1), ro, 1, body, drivertest.Until{Steps: 1})
	prepare(t, p1, "ckpt-1")
	recs := commit(t, e, p1, "ckpt-1", false)
	_, bm := bookmarkOf(t, recs, ro)
	run1.Cancel(driver.ErrCrashed) // while parked: the paused launch goes with it
	run1.Wait(t)
	restoreOwner(t, e, "ckpt-1", recs)
	sb1 := e.Session(ro).SandboxID
	if err := os.Remove(filepath.Join(e.SessionOf(sb1, bm.State), "steps")); err != nil {
		t.Fatal(err)
	}
	p2 := drivertest.NewParticipant()
	restore(t, e, p2, "ckpt-1", recs)
	r := e.Start(e.Runner(drivertest.Fake(steps, stepS), p2), ro, 2, body).MustSucceed(t)
	if len(r.Launches) != 2 || r.Launches[1].Resumed {
		t.Fatalf("want a second launch that started over, got %+v", r.Launches)
	}
	got := goneLines(e.Logs())
	if len(got) != 1 || !contains(got[0], "starting over") || contains(got[0], "relaunching on its saved session") {
		t.Errorf("want one line saying the paused launch is gone and the relaunch starts over, got %q", got)
	}
}

// TestRestartRunNeverParkedAndStartsOver proves that a run the owner
// cannot capture (the task says "restart": true, the owner answers with the
// restart header) is never parked: Prepare does not wait for it and exports
// no record of it, its launch is never paused and keeps running through the
// checkpoint. After a crash it starts over from its input: no record is
// restored, attempt 2 seeds again and launches fresh (resumed=false). When
// it ends verified the driver stops its sandbox, and the controller's
// retire of the crashed attempt has the owner stop the old one: no process
// of either is left.
func TestRestartRunNeverParkedAndStartsOver(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("restart")
	body := drivertest.Task(ro, steps, stepS, map[string]any{"restart": true})
	p1 := drivertest.NewParticipant()
	run1 := e.StartRunning(e.Runner(drivertest.Fake(steps, stepS), p1), ro, 1, body, drivertest.Until{Steps: 1, Kinds: allKinds})

	res := prepare(t, p1, "ckpt-1")
	if hasRecord(res.Records, ro) {
		t.Errorf("the prepare exported a restart run: %+v", res.Records)
	}
	if runs := p1.Runs(); len(runs) != 1 || runs[0].State != "waiting" {
		t.Errorf("participant runs %+v: want the restart run1 still in its harness step", runs)
	}
	held := len(drivertest.Steps(run1.Session))
	testkit.Eventually(t, "the restart run1 goes on during the checkpoint", func() (bool, string) {
		n := len(drivertest.Steps(run1.Session))
		return n > held, fmt.Sprintf("steps %d", n)
	})
	checkStates(t, "during the checkpoint", run1.Procs, "SRD")
	recs := commit(t, e, p1, "ckpt-1", false)
	if hasRecord(recs, ro) {
		t.Errorf("the commit holds a record of a restart run")
	}
	resume(t, p1, "ckpt-1")
	if n := len(e.Backend.Verbs("pause")); n != 0 {
		t.Errorf("a restart run's launch was paused %d times", n)
	}

	run1.Cancel(driver.ErrCrashed)
	if _, err := run1.Wait(t); !errors.Is(err, driver.ErrCrashed) {
		t.Fatalf("the crashed run1 returned %v, want ErrCrashed", err)
	}
	restoreOwner(t, e, "ckpt-1", recs)
	p2 := drivertest.NewParticipant()
	restore(t, e, p2, "ckpt-1", recs)
	// The controller retires the crashed attempt of a rollout it starts
	// over: the owner stops its session and sandbox (nothing else knows
	// them: they were never captured).
	if _, err := e.OwnerControl.Retire(context.Background(), &gym.RetireRequest{Request: request("retire-1"), EpisodeIDs: []gym.EpisodeID{{RolloutID: ro, Attempt: 1}}}); err != nil {
		t.Fatalf("retire attempt 1 on the owner: %v", err)
	}
	drivertest.CheckGone(t, "after the owner retired the crashed attempt", run1.Procs)
	rn2 := e.Runner(drivertest.Fake(steps, stepS), p2)
	h2 := e.Start(rn2, ro, 2, body)
	info := e.WaitSeeded(ro, 2)
	if info.SandboxID == run1.SandboxID || !info.Restart {
		t.Errorf("attempt 2 did not start over in a new session: %+v", info)
	}
	r := h2.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch in attempt 2, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	if r.Launches[0].Reason != "first launch" || r.Launches[0].ID != driver.LaunchID(ro, 2, 1, info.SandboxID) || r.Launches[0].SandboxID != info.SandboxID {
		t.Errorf("attempt 2's launch %+v: want a first launch of attempt 2 in %s", r.Launches[0], info.SandboxID)
	}
	if r.Fake.FirstStep != 1 {
		t.Errorf("attempt 2 went on from step %d, want a start from its input", r.Fake.FirstStep)
	}
	checkVerified(t, e, ro, r)
	if n := len(e.Backend.Verbs("pause")); n != 0 {
		t.Errorf("a restart run's launch was paused %d times", n)
	}
	checkDriverStoppedSandbox(t, e, info.SandboxID)
	e.CheckNoProcs("after verify")
}

// checkDriverStoppedSandbox fails unless the driver itself ran
// Ngsup.StopSandbox on the sandbox (it lists the launch folders, then stops
// each by its id).
func checkDriverStoppedSandbox(t *testing.T, e *drivertest.Env, sandboxID string) {
	t.Helper()
	listed, stopped := false, false
	for _, x := range e.Backend.Execs() {
		if x.Sandbox != sandboxID {
			continue
		}
		if len(x.Argv) == 3 && x.Argv[0] == "ls" && contains(x.Argv[2], "/launches") {
			listed = true
		}
		if x.Verb() == "stop" && listed {
			stopped = true
		}
	}
	if !listed || !stopped {
		t.Errorf("the driver did not stop the sandbox %s (listed launches %v, stopped %v)", sandboxID, listed, stopped)
	}
}

// TestNoSandboxRunIsARestartInItsOwnSandbox proves that a run the owner
// lends no sandbox ("no_sandbox": true) is a restart in a sandbox the
// driver makes (Runner.OwnSandbox): it is never parked or exported, it
// finishes in its own sandbox, and the driver stops that sandbox at the end
// (no process of it left).
func TestNoSandboxRunIsARestartInItsOwnSandbox(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("own")
	// The owner grades in a scratch sandbox holding the seed's files: the
	// check cannot see the harness's work.
	body := drivertest.Task(ro, steps, stepS, map[string]any{"no_sandbox": true, "check": "true"})
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	rn.OwnSandbox = e.OwnSandbox
	h := e.Start(rn, ro, 1, body)
	own := "own-" + ro
	sess := e.WaitSession(own, ro)
	procs := e.WaitPids(sess, allKinds...)
	e.WaitSteps(sess, 1)
	res := prepare(t, p, "ckpt-1")
	if hasRecord(res.Records, ro) {
		t.Errorf("the prepare exported a run in the driver's own sandbox")
	}
	held := len(drivertest.Steps(sess))
	testkit.Eventually(t, "the run goes on during the checkpoint", func() (bool, string) {
		n := len(drivertest.Steps(sess))
		return n > held, fmt.Sprintf("steps %d", n)
	})
	resume(t, p, "ckpt-1")
	r := h.MustSucceed(t)
	if len(r.Launches) != 1 || r.Launches[0].SandboxID != own {
		t.Fatalf("want one launch in %s, got %+v", own, r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	checkVerified(t, e, ro, r)
	if s := e.Session(ro); !s.NoSandbox || s.SandboxID != "" {
		t.Errorf("the owner lent a sandbox: %+v", s)
	}
	drivertest.CheckStepsOnce(t, sess, steps)
	checkDriverStoppedSandbox(t, e, own)
	drivertest.CheckGone(t, "after the run", procs)
	e.CheckNoProcs("after the run", own)
}
