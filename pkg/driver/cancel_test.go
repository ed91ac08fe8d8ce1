package driver_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/pkg/driver"
)

// TestCancelKillsLaunchAndClosesSession proves that cancelling a run, both
// while its launch runs and while it is parked with the launch paused,
// makes Run return the cancellation, kills every process of the launch
// (the pids the harness recorded, its detached daemon and the child in a
// session of its own included; nothing left in the sandbox), and closes the
// owner's session (the POST /close_session equivalent) without a verdict.
func TestCancelKillsLaunchAndClosesSession(t *testing.T) {
	t.Parallel()
	for _, parked := range []bool{false, true} {
		name := map[bool]string{false: "running", true: "parked-paused"}[parked]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := drivertest.New(t)
			p := drivertest.NewParticipant()
			rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
			ro := e.Rollout(name)
			run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, endlessSteps, stepS, nil), drivertest.Until{Steps: 1, Kinds: allKinds})
			if parked {
				prepare(t, p, "ckpt-1")
				checkHeld(t, "while parked", run.Procs)
			}

			run.Cancel(nil)
			if _, err := run.Wait(t); !errors.Is(err, context.Canceled) {
				t.Errorf("the cancelled run returned %v, want the cancellation", err)
			}
			drivertest.CheckGone(t, "after the cancellation", run.Procs)
			e.CheckNoProcs("after the cancellation", run.SandboxID)
			if s := e.Session(ro); !s.Closed || s.Verified {
				t.Errorf("the owner's session: closed %v verified %v; want closed without a verdict", s.Closed, s.Verified)
			}
			if n, v := e.Owner.Count(drivertest.CallClose, ro), e.Owner.Count(drivertest.CallVerify, ro); n != 1 || v != 0 {
				t.Errorf("the driver closed the session %d times and verified %d times; want one close, no verify", n, v)
			}
			if stops := e.Backend.Verbs("stop"); len(stops) == 0 {
				t.Errorf("the driver did not stop the launch")
			}
			if _, ok := runInfo(p, ro); ok {
				t.Errorf("the cancelled run is still registered")
			}
			if parked {
				resume(t, p, "ckpt-1")
			}
		})
	}
}

// TestOtherLaunchesLeftAlone proves that ending one run's launch touches
// no other launch: two runs go at once; one is cancelled (its launch
// killed, its session closed) while every process of the other keeps
// running, unstopped, and the other finishes its one launch verified.
func TestOtherLaunchesLeftAlone(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	gone, kept := e.Rollout("cancelled"), e.Rollout("kept")
	hg := e.Start(rn, gone, 1, drivertest.Task(gone, endlessSteps, stepS, nil))
	hk := e.Start(rn, kept, 1, drivertest.Task(kept, pauseSteps, stepS, nil))
	runG := e.WaitRunning(hg, drivertest.Until{Kinds: allKinds})
	runK := e.WaitRunning(hk, drivertest.Until{Steps: 1, Kinds: allKinds})

	runG.Cancel(nil)
	if _, err := runG.Wait(t); !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled run returned %v", err)
	}
	drivertest.CheckGone(t, "the cancelled run", runG.Procs)
	if live := drivertest.Live(runK.Procs); len(live) != len(runK.Procs) {
		t.Errorf("the other run lost processes: alive %v of %v", live, runK.Procs)
	}
	checkStates(t, "the other run", runK.Procs, "SRD")
	r := runK.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("the other run launched %d times", len(r.Launches))
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	checkVerified(t, e, kept, r)
	drivertest.CheckStepsOnce(t, runK.Session, pauseSteps)
}

// TestIncompleteStopIsWarned proves that a stop whose reply says it could
// not search everything (partial: the supervisor's tree was not searched;
// out_of_time: it ran out of its own time) is logged as a warning naming
// the launch, never taken silently for a clean stop. The real stop of a
// cancelled run runs; its reply is marked so on its way back.
func TestIncompleteStopIsWarned(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		res, err := next(ctx, req)
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "stop" {
			res.Stdout = bytes.Replace(res.Stdout, []byte(`{`), []byte(`{"partial":true,"out_of_time":true,`), 1)
		}
		return res, err
	})
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	ro := e.Rollout("stop-partial")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, endlessSteps, stepS, nil), drivertest.Until{Steps: 1})
	run.Cancel(nil)
	run.Wait(t)
	launch := driver.LaunchID(ro, 1, 1, run.SandboxID)
	for _, line := range strings.Split(e.Logs(), "\n") {
		if contains(line, "level=WARN") && contains(line, launch) && contains(line, "partial=true") && contains(line, "out_of_time=true") {
			return
		}
	}
	t.Errorf("no warning names launch %s and says its stop was partial and out of time", launch)
}

// TestRealPartialStopStillWarns proves that a stop that really could not
// search the launch's tree is still a warning: the supervisor of a running
// launch is SIGKILLed and the run cancelled, so its stop falls back to the
// tag and the known set (partial, the launch not ended); the driver warns
// naming the launch and partial=true, and every process of the launch is
// gone. Only a folder a fork carried in (copied) is stopped without one.
func TestRealPartialStopStillWarns(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ro := e.Rollout("real-partial")
	run := e.StartRunning(e.Runner(drivertest.Fake(pauseSteps, stepS), drivertest.NewParticipant()), ro, 1, drivertest.Task(ro, endlessSteps, stepS, nil), drivertest.Until{Kinds: allKinds})
	launch := driver.LaunchID(ro, 1, 1, run.SandboxID)
	rec := e.Receipt(run.SandboxID, launch)
	if rec == nil || !drivertest.IsSupervisor(rec.SupervisorPID) || rec.Ended {
		t.Fatalf("no live supervisor of a running harness in the receipt: %+v", rec)
	}
	if err := syscall.Kill(rec.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Gone before the stop begins, or the stop still finds it alive.
	drivertest.CheckGone(t, "the killed supervisor", []drivertest.Proc{{Kind: "supervisor", PID: rec.SupervisorPID, StartTicks: rec.SupervisorStartTicks}})
	run.Cancel(nil)
	if _, err := run.Wait(t); !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled run returned %v", err)
	}
	drivertest.CheckGone(t, "the cancelled run", run.Procs)
	for _, line := range strings.Split(e.Logs(), "\n") {
		if contains(line, "level=WARN") && contains(line, "the stop could not make sure the launch is gone") &&
			contains(line, launch) && contains(line, "partial=true") {
			return
		}
	}
	t.Errorf("no warning names launch %s and says its stop was partial:\n%s", launch, e.Logs())
}

// TestSameRolloutOnOneHostNeverSharesALaunch proves that two deployments on
// one host (two owners and drivers, as two Gym jobs reusing the rollout id
// "<task>-<rollout>" would be) never reach each other's processes: the same
// rollout id runs in both, the supervisor of the first is SIGKILLed and
// its run cancelled, so its stop finds the launch by its id among the
// host's processes (no PID namespaces here); every process of the other
// deployment's run lives on, and that run finishes every step once. Before
// the sandbox id was hashed into launch ids both launches had one id, and
// that stop killed the other's harness.
func TestSameRolloutOnOneHostNeverSharesALaunch(t *testing.T) {
	t.Parallel()
	a, b := drivertest.New(t), drivertest.New(t)
	ro := a.Rollout("twin")
	pa, pb := drivertest.NewParticipant(), drivertest.NewParticipant()
	ha := a.Start(a.Runner(drivertest.Fake(pauseSteps, stepS), pa), ro, 1, drivertest.Task(ro, endlessSteps, stepS, nil))
	hb := b.Start(b.Runner(drivertest.Fake(pauseSteps, stepS), pb), ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
	runA := a.WaitRunning(ha, drivertest.Until{Kinds: allKinds})
	runB := b.WaitRunning(hb, drivertest.Until{Steps: 1, Kinds: allKinds})
	if idA, idB := driver.LaunchID(ro, 1, 1, runA.SandboxID), driver.LaunchID(ro, 1, 1, runB.SandboxID); idA == idB {
		t.Fatalf("both deployments' launches are %s", idA)
	}

	rec := a.Receipt(runA.SandboxID, driver.LaunchID(ro, 1, 1, runA.SandboxID))
	if rec == nil || !drivertest.IsSupervisor(rec.SupervisorPID) || rec.Ended {
		t.Fatalf("no live supervisor of a running harness in the first deployment's receipt: %+v", rec)
	}
	if err := syscall.Kill(rec.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	runA.Cancel(nil)
	if _, err := runA.Wait(t); !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled run returned %v", err)
	}
	drivertest.CheckGone(t, "the cancelled run", runA.Procs)
	if live := drivertest.Live(runB.Procs); len(live) != len(runB.Procs) {
		t.Errorf("the other deployment's run lost processes: alive %v of %v", live, runB.Procs)
	}
	r := runB.MustSucceed(t)
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	drivertest.CheckStepsOnce(t, runB.Session, pauseSteps)
}
