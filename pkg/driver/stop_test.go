package driver_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// only returns fake options that turn off every extra process but those
// named.
func only(kinds ...string) map[string]any {
	opts := map[string]any{"child": false, "own_session": false, "daemon": false, "untagged": false}
	for _, k := range kinds {
		opts[k] = true
	}
	return opts
}

// TestCheckpointStopsLaunch proves each stop scenario of the seed, both
// supervised (under `ngsup run`) and unsupervised (tagged only; pause,
// continue and stop name the launch with --id): with pausing off, a
// checkpoint stops the launch during the install phase, with a child in a
// session of its own, with a detached double-forked daemon, with a child
// that cleared its environment (untagged), and when the harness ignores
// SIGINT (killed after the short grace). While the run is parked every pid
// the launch recorded is gone (pid missing or start time changed) and no
// process is left in the sandbox; after the resume the run relaunches and
// finishes verified, every step exactly once.
func TestCheckpointStopsLaunch(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		fake    map[string]any
		kinds   []string
		install bool
	}{
		// The install lasts until the test lets it end, after the
		// checkpoint: the stop must land during it, however long the stop
		// takes (a 2 s install was outrun by a checkpoint's stop through a
		// loaded Docker engine in CI).
		{"install", mergeOpts(only(), map[string]any{"install_until": "install-may-end"}), nil, true},
		{"own-session", only("own_session"), []string{"harness", "own_session"}, false},
		{"daemon", only("daemon"), []string{"harness", "daemon"}, false},
		{"untagged-child", only("untagged"), []string{"harness", "untagged"}, false},
		{"child", only("child"), []string{"harness", "child"}, false},
		{"ignores-sigint", map[string]any{"ignore_sigint": true}, allKinds, false},
	}
	for _, supervised := range []bool{true, false} {
		mode := map[bool]string{true: "supervised", false: "unsupervised"}[supervised]
		for _, c := range cases {
			t.Run(mode+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				const n = 4
				e := drivertest.New(t)
				p := drivertest.NewParticipant()
				rn := e.Runner(drivertest.Fake(n, stepS), p)
				rn.PauseAtCheckpoints = boolp(false)
				rn.Unsupervised = !supervised
				ro := e.Rollout(c.name)
				run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, n, stepS, map[string]any{"fake": c.fake}), drivertest.Until{})
				var procs []drivertest.Proc
				if c.install {
					testkit.Eventually(t, "the install began", func() (bool, string) {
						_, err := os.Stat(filepath.Join(run.Session, "install"))
						return err == nil, "no install folder"
					})
				} else {
					procs = e.WaitPids(run.Session, c.kinds...)
					e.WaitSteps(run.Session, 1)
				}

				res := prepare(t, p, "ckpt-1")
				_, bm := bookmarkOf(t, res.Records, ro)
				if bm.Next != driver.StageHarness || bm.Paused != nil || !bm.Resume || len(bm.Launches) != 1 || bm.Launches[0].Outcome != driver.OutcomeInterrupted {
					t.Errorf("want a bookmark that relaunches a stopped launch, got %+v", bm)
				}
				drivertest.CheckGone(t, "while parked after the stop", procs)
				e.CheckNoProcs("while parked after the stop", run.SandboxID)
				if c.install {
					for _, f := range []string{"install/done", "pids", "steps"} {
						if _, err := os.Stat(filepath.Join(run.Session, f)); err == nil {
							t.Errorf("%s exists: the stop did not land during the install", f)
						}
					}
				}
				launch := bm.Launches[0].ID
				stops := drivertest.ForLaunch(e.Backend.Verbs("stop"), launch)
				if len(stops) != 1 || stops[0].Arg("--grace") != drivertest.StopGrace.String() {
					t.Errorf("want one ngsup stop of %s with --grace %s, got %+v", launch, drivertest.StopGrace, stops)
				} else if got := stops[0].Arg("--id"); (got == launch) == supervised {
					t.Errorf("ngsup stop %v: --id must name exactly the unsupervised launches", stops[0].Argv)
				}
				if n := len(e.Backend.Verbs("pause")); n != 0 {
					t.Errorf("ngsup pause ran %d times with pausing off", n)
				}
				if c.install {
					// The relaunch's install may end now.
					mayEnd := e.HostOf(run.SandboxID, filepath.Join(e.Local.MountPoint(), local.WorkFolder, "install-may-end"))
					if err := os.WriteFile(mayEnd, nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				resume(t, p, "ckpt-1")

				r := run.MustSucceed(t)
				if len(r.Launches) != 2 {
					t.Fatalf("want two launches, got %+v", r.Launches)
				}
				drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeInterrupted, 0, false)
				drivertest.CheckLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, !c.install)
				for _, l := range r.Launches {
					if l.Supervised != supervised {
						t.Errorf("launch %s: supervised %v, want %v", l.ID, l.Supervised, supervised)
					}
				}
				if runs := len(e.Backend.Verbs("run")); supervised && runs != 2 || !supervised && runs != 0 {
					t.Errorf("ngsup run ran %d times", runs)
				}
				checkVerified(t, e, ro, r)
				sessions := e.FakeSessions(run.SandboxID, ro)
				drivertest.CheckStepsOnce(t, sessions[len(sessions)-1], n)
				if !supervised {
					killUntaggedOrphans(t, sessions[len(sessions)-1])
				}
				e.CheckNoProcs("after verify", run.SandboxID)
			})
		}
	}
}

func mergeOpts(a, b map[string]any) map[string]any {
	for k, v := range b {
		a[k] = v
	}
	return a
}

// plainAdapter is the fake adapter without the PausesAtCheckpoints opt-in.
type plainAdapter struct{ a *fake.Adapter }

func (p plainAdapter) Name() string { return "plain-fake" }
func (p plainAdapter) NewState(ro string, attempt int, sb harness.LentSandbox) (json.RawMessage, error) {
	return p.a.NewState(ro, attempt, sb)
}
func (p plainAdapter) ResumeDecision(ctx context.Context, sb harness.LentSandbox, st json.RawMessage, ro string, attempt int) (harness.Decision, error) {
	return p.a.ResumeDecision(ctx, sb, st, ro, attempt)
}
func (p plainAdapter) Launch(ctx context.Context, lc harness.LaunchContext) (harness.LaunchSpec, error) {
	return p.a.Launch(ctx, lc)
}
func (p plainAdapter) Response(ctx context.Context, sb harness.LentSandbox, st json.RawMessage, res harness.HarnessResult) (json.RawMessage, error) {
	return p.a.Response(ctx, sb, st, res)
}

// TestAdapterThatDoesNotPauseIsStopped proves that an adapter that does not
// pause gets no pause: with Runner.PauseAtCheckpoints=false, with an
// adapter type that lacks PausesAtCheckpoints, and with one that answers
// false, a checkpoint stops the launch (no `ngsup pause` ever runs; the
// first launch is interrupted with pauses=0), the run relaunches on the
// saved session after the resume and finishes verified, every step once.
func TestAdapterThatDoesNotPauseIsStopped(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		adapter  func() harness.Adapter
		override bool
	}{
		{"runner-override", func() harness.Adapter { return drivertest.Fake(steps, stepS) }, true},
		{"no-opt-in", func() harness.Adapter { return plainAdapter{drivertest.Fake(steps, stepS)} }, false},
		{"opt-in-false", func() harness.Adapter { a := drivertest.Fake(steps, stepS); a.Pause = false; return a }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := drivertest.New(t)
			p := drivertest.NewParticipant()
			rn := e.Runner(c.adapter(), p)
			if c.override {
				rn.PauseAtCheckpoints = boolp(false)
			}
			ro := e.Rollout(c.name)
			run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{Steps: 2, Kinds: allKinds})
			res := prepare(t, p, "ckpt-1")
			_, bm := bookmarkOf(t, res.Records, ro)
			if bm.Paused != nil || !bm.Resume {
				t.Errorf("want a bookmark that relaunches, got %+v", bm)
			}
			drivertest.CheckGone(t, "while parked", run.Procs)
			resume(t, p, "ckpt-1")
			r := run.MustSucceed(t)
			if len(r.Launches) != 2 {
				t.Fatalf("want two launches, got %+v", r.Launches)
			}
			drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeInterrupted, 0, false)
			drivertest.CheckLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
			if n := len(e.Backend.Verbs("pause")); n != 0 {
				t.Errorf("ngsup pause ran %d times for an adapter that does not pause", n)
			}
			checkVerified(t, e, ro, r)
			drivertest.CheckStepsOnce(t, run.Session, steps)
		})
	}
}

// killUntaggedOrphans kills, by pid and start time, what a finished
// unsupervised launch left that nothing can find: a child that cleared its
// environment (no tag) and was orphaned when the harness exited, never seen
// by an ngsup pass while its parent lived. Without a supervisor to adopt it,
// only stopping the whole sandbox ends it, and a local sandbox cannot be
// stopped (pkg/driver/sandbox/local implements no sandbox.Stopper). This is
// the known limit of the unsupervised fallback; the test logs it.
func killUntaggedOrphans(t *testing.T, hostSessionDir string) {
	t.Helper()
	procs, _ := drivertest.ReadPids(hostSessionDir)
	for _, p := range drivertest.Live(procs) {
		if p.Kind == "untagged" && p.Kill() {
			t.Logf("known limit of the unsupervised fallback: killed the orphaned untagged child %s of a finished launch", p)
		}
	}
}

// TestCutAnswersAreAskedAgain proves that an `ngsup wait` (and status,
// continue, stop) whose answer comes back cut short, as an exec's output can
// under load, is sent again instead of failing the run: the first answer of
// every such command is cut in half (the command itself ran), and the run
// still finishes verified with one launch, each cut verb sent again.
func TestCutAnswersAreAskedAgain(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	var mu sync.Mutex
	cut := map[string]int{}
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		res, err := next(ctx, req)
		if err != nil || len(req.Argv) < 2 || !drivertest.IsNgsup(req.Argv[0]) || len(res.Stdout) < 4 {
			return res, err
		}
		switch verb := req.Argv[1]; verb {
		case "wait", "status", "continue", "stop":
			mu.Lock()
			defer mu.Unlock()
			key := verb + " " + strings.Join(req.Argv[2:], " ")
			if cut[key] == 0 {
				cut[key]++
				res.Stdout = res.Stdout[:len(res.Stdout)/2]
			}
		}
		return res, err
	})
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("cut-answers")
	r := e.Start(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil)).MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	checkVerified(t, e, ro, r)
	mu.Lock()
	n := len(cut)
	mu.Unlock()
	waits := e.Backend.Verbs("wait")
	if n == 0 || len(waits) < 2 {
		t.Fatalf("no answer was cut (%d cut, %d waits): the test proves nothing", n, len(waits))
	}
	// The last wait is the one that saw the end: its answer was whole.
	last := waits[len(waits)-1]
	if last.ExitCode != 0 {
		t.Errorf("the last wait exited %d, want 0 (ended)", last.ExitCode)
	}
}

// TestCutRunAnswerLaunchesOnce proves that an `ngsup run --detach` whose
// answer comes back cut (the supervisor did start) is never followed by a
// second harness: every run answer is cut, and the first look at the launch
// folder fails too, so the driver sends `ngsup run` again, which refuses
// (the folder holds a launch); the driver then finds the receipt and
// follows that supervised launch. One launch, supervised, every step once,
// no unsupervised start.
func TestCutRunAnswerLaunchesOnce(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	var mu sync.Mutex
	statuses := 0
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "status" {
			mu.Lock()
			statuses++
			first := statuses == 1
			mu.Unlock()
			if first {
				return execRes{ExitCode: 2, Stderr: []byte("ngsup: no launch in this folder (drivertest)\n")}, nil
			}
		}
		res, err := next(ctx, req)
		if err == nil && len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "run" && len(res.Stdout) > 2 {
			res.Stdout = res.Stdout[:len(res.Stdout)/2]
		}
		return res, err
	})
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("cut-run")
	run := e.StartRunning(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil), drivertest.Until{})
	r := run.MustSucceed(t)
	if len(r.Launches) != 1 || !r.Launches[0].Supervised {
		t.Fatalf("want one supervised launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, run.Session, steps)
	if n := len(e.Backend.Verbs("run")); n != 2 {
		t.Errorf("ngsup run ran %d times, want 2 (the second refused)", n)
	}
	for _, x := range e.Backend.Execs() {
		if len(x.Argv) > 1 && x.Argv[0] == "sh" && x.Argv[1] == "-c" && x.Env[proto.TagEnv] != "" {
			t.Errorf("the harness was started unsupervised too: %v", x.Argv)
		}
	}
}
