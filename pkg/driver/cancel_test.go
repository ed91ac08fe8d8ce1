package driver_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/internal/drivertest"
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
			p := newParticipant()
			rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
			ro := e.Rollout(name)
			h := e.Start(rn, ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
			sbID := e.WaitSeeded(ro, 1).SandboxID
			sess := e.WaitSession(sbID, ro)
			procs := e.WaitPids(sess, allKinds...)
			e.WaitSteps(sess, 1)
			if parked {
				prepare(t, p, "ckpt-1")
				checkStates(t, "while parked", procs, "Tt")
			}

			h.Cancel(nil)
			if _, err := h.Wait(t); !errors.Is(err, context.Canceled) {
				t.Errorf("the cancelled run returned %v, want the cancellation", err)
			}
			drivertest.CheckGone(t, "after the cancellation", procs)
			e.CheckNoProcs("after the cancellation", sbID)
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
	p := newParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	gone, kept := e.Rollout("cancelled"), e.Rollout("kept")
	hg := e.Start(rn, gone, 1, drivertest.Task(gone, pauseSteps, stepS, nil))
	hk := e.Start(rn, kept, 1, drivertest.Task(kept, pauseSteps, stepS, nil))
	sbG, sbK := e.WaitSeeded(gone, 1).SandboxID, e.WaitSeeded(kept, 1).SandboxID
	sessG, sessK := e.WaitSession(sbG, gone), e.WaitSession(sbK, kept)
	procsG, procsK := e.WaitPids(sessG, allKinds...), e.WaitPids(sessK, allKinds...)
	e.WaitSteps(sessK, 1)

	hg.Cancel(nil)
	if _, err := hg.Wait(t); !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled run returned %v", err)
	}
	drivertest.CheckGone(t, "the cancelled run", procsG)
	if live := drivertest.Live(procsK); len(live) != len(procsK) {
		t.Errorf("the other run lost processes: alive %v of %v", live, procsK)
	}
	checkStates(t, "the other run", procsK, "SRD")
	r := hk.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("the other run launched %d times", len(r.Launches))
	}
	checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	checkVerified(t, e, kept, r)
	drivertest.CheckStepsOnce(t, sessK, pauseSteps)
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
	p := newParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	ro := e.Rollout("stop-partial")
	h := e.Start(rn, ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
	sbID := e.WaitSeeded(ro, 1).SandboxID
	e.WaitSteps(e.WaitSession(sbID, ro), 1)
	h.Cancel(nil)
	h.Wait(t)
	launch := driver.LaunchID(ro, 1, 1, sbID)
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
	h := e.Start(e.Runner(drivertest.Fake(pauseSteps, stepS), newParticipant()), ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
	sbID := e.WaitSeeded(ro, 1).SandboxID
	sess := e.WaitSession(sbID, ro)
	procs := e.WaitPids(sess, allKinds...)
	launch := driver.LaunchID(ro, 1, 1, sbID)
	rec := e.Receipt(sbID, launch)
	if rec == nil || !drivertest.IsSupervisor(rec.SupervisorPID) {
		t.Fatalf("no live supervisor in the receipt: %+v", rec)
	}
	if err := syscall.Kill(rec.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Gone before the stop begins, or the stop still finds it alive.
	drivertest.CheckGone(t, "the killed supervisor", []drivertest.Proc{{Kind: "supervisor", PID: rec.SupervisorPID, StartTicks: rec.SupervisorStartTicks}})
	h.Cancel(nil)
	if _, err := h.Wait(t); !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled run returned %v", err)
	}
	drivertest.CheckGone(t, "the cancelled run", procs)
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
	pa, pb := newParticipant(), newParticipant()
	ha := a.Start(a.Runner(drivertest.Fake(pauseSteps, stepS), pa), ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
	hb := b.Start(b.Runner(drivertest.Fake(pauseSteps, stepS), pb), ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
	sbA, sbB := a.WaitSeeded(ro, 1).SandboxID, b.WaitSeeded(ro, 1).SandboxID
	sessA, sessB := a.WaitSession(sbA, ro), b.WaitSession(sbB, ro)
	procsA, procsB := a.WaitPids(sessA, allKinds...), b.WaitPids(sessB, allKinds...)
	b.WaitSteps(sessB, 1)
	if idA, idB := driver.LaunchID(ro, 1, 1, sbA), driver.LaunchID(ro, 1, 1, sbB); idA == idB {
		t.Fatalf("both deployments' launches are %s", idA)
	}

	rec := a.Receipt(sbA, driver.LaunchID(ro, 1, 1, sbA))
	if rec == nil || !drivertest.IsSupervisor(rec.SupervisorPID) {
		t.Fatalf("no live supervisor in the first deployment's receipt: %+v", rec)
	}
	if err := syscall.Kill(rec.SupervisorPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ha.Cancel(nil)
	if _, err := ha.Wait(t); !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled run returned %v", err)
	}
	drivertest.CheckGone(t, "the cancelled run", procsA)
	if live := drivertest.Live(procsB); len(live) != len(procsB) {
		t.Errorf("the other deployment's run lost processes: alive %v of %v", live, procsB)
	}
	r := hb.MustSucceed(t)
	checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	drivertest.CheckStepsOnce(t, sessB, pauseSteps)
}
