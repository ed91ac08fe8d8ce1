package driver_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/proto"
)

// batchWindow is the tests' batch window: long enough that every run
// parked at one checkpoint joins the first command even on a loaded
// machine (the window is a wait, never a speed the tests assert).
const batchWindow = 500 * time.Millisecond

// batchEnv is a drivertest.Env whose ngsup batches with batchWindow; it
// skips when the tests run through a backend without the capability.
func batchEnv(t *testing.T) *drivertest.Env {
	t.Helper()
	if b := os.Getenv(drivertest.BackendEnv); b != "" && b != "local" {
		t.Skipf("%s=%s: only the local backend batches the commands of one host", drivertest.BackendEnv, b)
	}
	e := drivertest.New(t)
	e.Ngsup.BatchWindow = batchWindow
	return e
}

// dirsOf lists the --dir arguments of an exec.
func dirsOf(x drivertest.Exec) []string {
	var out []string
	for i, a := range x.Argv {
		if a == "--dir" && i+1 < len(x.Argv) {
			out = append(out, x.Argv[i+1])
		}
	}
	return out
}

// launchCounts counts, by launch id (its folder's name), how often each
// launch was named by the execs.
func launchCounts(execs []drivertest.Exec) map[string]int {
	out := map[string]int{}
	for _, x := range execs {
		for _, d := range dirsOf(x) {
			out[d[strings.LastIndexByte(d, '/')+1:]]++
		}
	}
	return out
}

// batchedRun is one run of the batch tests and its launch's id.
type batchedRun struct {
	*drivertest.Run
	launch string
}

// startBatchedRuns starts n runs of pauseSteps steps and waits until each
// harness runs (every kind of process recorded, a step done).
func startBatchedRuns(t *testing.T, e *drivertest.Env, rn *driver.Runner, name string, n int) []*batchedRun {
	t.Helper()
	started := make([]*drivertest.Handle, n)
	for i := range started {
		ro := e.Rollout(fmt.Sprintf("%s-%02d", name, i))
		started[i] = e.Start(rn, ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
	}
	runs := make([]*batchedRun, n)
	for i, h := range started {
		r := e.WaitRunning(h, drivertest.Until{Steps: 1, Kinds: allKinds})
		runs[i] = &batchedRun{Run: r, launch: driver.LaunchID(r.Rollout, 1, 1, r.SandboxID)}
	}
	return runs
}

// TestBatchedPauseAndContinue proves that the launches of many runs paused
// at one checkpoint are paused by far fewer `ngsup pause` commands than
// runs (one command names several launch folders, by host path), that each
// launch is named exactly once and confirmed paused (every process of it
// stopped, exported as a paused launch), and that the continue after the
// checkpoint is batched too: every launch continues in place, and each run
// has one launch with pauses=1, every step once, verified.
func TestBatchedPauseAndContinue(t *testing.T) {
	t.Parallel()
	const n = 12
	e := batchEnv(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	runs := startBatchedRuns(t, e, rn, "batch", n)

	res := prepare(t, p, "ckpt-1")
	for _, r := range runs {
		_, bm := bookmarkOf(t, res.Records, r.Rollout)
		if bm.Paused == nil || bm.Paused.ID != r.launch || !bm.Paused.Supervised {
			t.Errorf("%s: want its launch exported paused, got %+v", r.Rollout, bm.Paused)
		}
		checkHeld(t, r.Rollout+": while parked", r.Procs)
		checkAllStopped(t, e, r.Rollout+": while parked", r.SandboxID)
	}
	pauses := e.Backend.Verbs("pause")
	if len(pauses) > n/3 {
		t.Errorf("%d runs were paused by %d ngsup pause commands, want at most %d", n, len(pauses), n/3)
	}
	counts := launchCounts(pauses)
	for _, r := range runs {
		if counts[r.launch] != 1 {
			t.Errorf("launch %s was named by %d pause commands, want 1", r.launch, counts[r.launch])
		}
	}
	batched := 0
	for _, x := range pauses {
		if len(dirsOf(x)) > 1 {
			batched++
			if x.ExitCode != 0 || x.Timeout != launch.ControlTimeout {
				t.Errorf("batched pause %v: exit %d, budget %s; want 0 and %s", x.Argv, x.ExitCode, x.Timeout, launch.ControlTimeout)
			}
			for _, d := range dirsOf(x) {
				if !strings.HasPrefix(d, e.Local.Base()+"/") {
					t.Errorf("batched pause names %s, not a host path under %s", d, e.Local.Base())
				}
			}
		}
	}
	if batched == 0 {
		t.Errorf("no pause command named several launches: %d commands", len(pauses))
	}

	resume(t, p, "ckpt-1")
	for _, r := range runs {
		res := r.MustSucceed(t)
		if len(res.Launches) != 1 {
			t.Errorf("%s: want one launch, got %+v", r.Rollout, res.Launches)
			continue
		}
		drivertest.CheckLaunch(t, res.Launches[0], driver.OutcomeFinished, 1, false)
		checkVerified(t, e, r.Rollout, res)
		drivertest.CheckStepsOnce(t, r.Session, pauseSteps)
	}
	continues := e.Backend.Verbs("continue")
	if len(continues) >= n {
		t.Errorf("%d runs were continued by %d ngsup continue commands, want fewer", n, len(continues))
	}
	counts = launchCounts(continues)
	for _, r := range runs {
		if counts[r.launch] != 1 {
			t.Errorf("launch %s was named by %d continue commands, want 1", r.launch, counts[r.launch])
		}
		if n := len(drivertest.ForLaunch(e.Backend.Verbs("run"), r.launch)); n != 1 {
			t.Errorf("launch %s was started %d times, want once", r.launch, n)
		}
	}
	for _, r := range runs {
		drivertest.CheckGone(t, r.Rollout+": after verify", r.Procs)
	}
	e.CheckNoProcs("after verify")
}

// TestBatchedPauseKeepsEndedLaunch proves that a launch that had already
// ended when its run was asked to park keeps its result inside a batched
// pause: the command that names it with the others says exit 3 (its line
// code 3, the others 0), the others are paused and continue in place
// (pauses=1), and the ended run is neither paused nor continued (one
// launch, pauses=0, finished, verified).
func TestBatchedPauseKeepsEndedLaunch(t *testing.T) {
	t.Parallel()
	const n = 4
	e := batchEnv(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	short := e.Rollout("batch-ended")
	// The launch's folder is known by its readable prefix before its
	// sandbox is (the id's hash covers the sandbox id).
	shortPrefix := "/launches/" + short + "-a1-l1-"
	held := make(chan struct{})
	var waits atomic.Int32
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 3 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "wait" &&
			strings.Contains(req.Argv[3], shortPrefix) && waits.Add(1) == 1 {
			close(held)
			<-ctx.Done() // held until the park request cancels the wait
			return execRes{ExitCode: -1}, ctx.Err()
		}
		return next(ctx, req)
	})
	hShort := e.Start(rn, short, 1, drivertest.Task(short, 3, 0.1, nil))
	runs := startBatchedRuns(t, e, rn, "batch-kept", n)
	await(t, held, "the driver waits on the short launch", hShort)
	shortSb := e.Session(short).SandboxID
	shortLaunch := driver.LaunchID(short, 1, 1, shortSb)
	testkit.Eventually(t, "the short harness has ended", func() (bool, string) {
		r := e.Receipt(shortSb, shortLaunch)
		return r != nil && r.Ended, "no ended receipt"
	})

	res := prepare(t, p, "ckpt-1")
	for _, r := range runs {
		if _, bm := bookmarkOf(t, res.Records, r.Rollout); bm.Paused == nil {
			t.Errorf("%s: want its launch exported paused", r.Rollout)
		}
		checkHeld(t, r.Rollout+": while parked", r.Procs)
	}
	pauses := e.Backend.Verbs("pause")
	withShort := drivertest.ForLaunch(pauses, shortLaunch)
	if len(withShort) != 1 || len(dirsOf(withShort[0])) < 2 || withShort[0].ExitCode != proto.ExitEnded {
		t.Errorf("want one batched pause naming the ended launch with others and exiting %d, got %+v", proto.ExitEnded, withShort)
	}
	counts := launchCounts(pauses)
	for _, r := range runs {
		if counts[r.launch] != 1 {
			t.Errorf("launch %s was named by %d pause commands, want 1", r.launch, counts[r.launch])
		}
	}
	resume(t, p, "ckpt-1")

	rs := hShort.MustSucceed(t)
	if len(rs.Launches) != 1 {
		t.Fatalf("the ended run: want one launch, got %+v", rs.Launches)
	}
	drivertest.CheckLaunch(t, rs.Launches[0], driver.OutcomeFinished, 0, false)
	checkVerified(t, e, short, rs)
	if c := drivertest.ForLaunch(e.Backend.Verbs("continue"), shortLaunch); len(c) != 0 {
		t.Errorf("the ended launch was continued: %+v", c)
	}
	for _, r := range runs {
		res := r.MustSucceed(t)
		if len(res.Launches) != 1 {
			t.Errorf("%s: want one launch, got %+v", r.Rollout, res.Launches)
			continue
		}
		drivertest.CheckLaunch(t, res.Launches[0], driver.OutcomeFinished, 1, false)
		checkVerified(t, e, r.Rollout, res)
		drivertest.CheckStepsOnce(t, r.Session, pauseSteps)
	}
	if slices.ContainsFunc(e.Backend.Verbs("run"), func(x drivertest.Exec) bool { return x.ExitCode != 0 }) {
		t.Errorf("a launch failed to start")
	}
	e.CheckNoProcs("after verify")
}

// TestBatchedPauseCommandsBounded proves that the batched pause commands
// of one host never run more at once than Ngsup.BatchConcurrency, and that
// the launches that wait for a slot are still each paused exactly once and
// continue in place. Eight runs park at one checkpoint with batches of at
// most two launches and two slots: four full batches form at once. Every
// pause command is held (before it runs) until a third is running, which
// only a driver without the bound lets happen, or a second has passed;
// the most seen running at once must be two.
func TestBatchedPauseCommandsBounded(t *testing.T) {
	t.Parallel()
	const n, perBatch, slots = 8, 2, 2
	e := batchEnv(t)
	e.Ngsup.BatchMax = perBatch
	e.Ngsup.BatchConcurrency = slots
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	runs := startBatchedRuns(t, e, rn, "bound", n)

	var running, most atomic.Int32
	over := make(chan struct{})
	var overOnce sync.Once
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) < 2 || !drivertest.IsNgsup(req.Argv[0]) || req.Argv[1] != "pause" {
			return next(ctx, req)
		}
		now := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		if now > slots {
			overOnce.Do(func() { close(over) })
		}
		// Held so that commands the driver lets run together overlap;
		// the wait is no assertion (a driver that keeps the bound only
		// runs slower here).
		select {
		case <-over:
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return next(ctx, req)
	})

	res := prepare(t, p, "ckpt-1")
	if m := most.Load(); m > slots {
		t.Errorf("%d pause commands ran at once, want at most %d (BatchConcurrency)", m, slots)
	}
	for _, r := range runs {
		if _, bm := bookmarkOf(t, res.Records, r.Rollout); bm.Paused == nil || bm.Paused.ID != r.launch {
			t.Errorf("%s: want its launch exported paused, got %+v", r.Rollout, bm.Paused)
		}
		checkHeld(t, r.Rollout+": while parked", r.Procs)
	}
	counts := launchCounts(e.Backend.Verbs("pause"))
	for _, r := range runs {
		if counts[r.launch] != 1 {
			t.Errorf("launch %s was named by %d pause commands, want 1", r.launch, counts[r.launch])
		}
	}
	resume(t, p, "ckpt-1")
	for _, r := range runs {
		res := r.MustSucceed(t)
		if len(res.Launches) != 1 {
			t.Errorf("%s: want one launch, got %+v", r.Rollout, res.Launches)
			continue
		}
		drivertest.CheckLaunch(t, res.Launches[0], driver.OutcomeFinished, 1, false)
		drivertest.CheckStepsOnce(t, r.Session, pauseSteps)
	}
	e.CheckNoProcs("after verify")
}
