package driver_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// failWaits makes the driver's `ngsup wait` fail, as a broken exec channel
// would, from the moment armed is closed (a wait in flight fails then too).
func failWaits(armed <-chan struct{}) drivertest.ExecHook {
	broken := func(sb sandbox.Sandbox) (sandbox.ExecResult, error) {
		return sandbox.ExecResult{ExitCode: -1}, fmt.Errorf("exec in %s: %w: the connection dropped (drivertest)", sb.ID(), sandbox.ErrTransport)
	}
	return func(ctx context.Context, sb sandbox.Sandbox, req sandbox.ExecRequest, next drivertest.Next) (sandbox.ExecResult, error) {
		if len(req.Argv) < 2 || !drivertest.IsNgsup(req.Argv[0]) || req.Argv[1] != "wait" {
			return next(ctx, req)
		}
		select {
		case <-armed:
			return broken(sb)
		default:
		}
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		type out struct {
			res sandbox.ExecResult
			err error
		}
		ch := make(chan out, 1)
		go func() {
			r, err := next(cctx, req)
			ch <- out{r, err}
		}()
		select {
		case o := <-ch:
			return o.res, o.err
		case <-armed:
			cancel()
			<-ch
			return broken(sb)
		}
	}
}

// TestLeavingTheSandbox proves the seed's table "Leaving the sandbox":
//   - a checkpointed run that verified leaves the session to the owner:
//     the owner's verify closed it, the driver made no close call and
//     stopped nothing itself (also when the harness exited non-zero: its
//     result is graded, the launch recorded failed with its exit code);
//   - a checkpointed run that failed before a verdict (its exec channel
//     broke while the launch ran; the owner could not run the check; the
//     launch could not be prepared) kills its launch and closes the session
//     through the owner (closed, not verified);
//   - a restart run that verified or failed stops its sandbox itself and
//     makes no close call.
//
// In every case no process of the run is left in its sandbox.
func TestLeavingTheSandbox(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// extra is merged into the task.
		extra map[string]any
		// breakWait breaks the exec channel once the launch runs.
		breakWait bool
		// pause opens and closes a checkpoint while the launch runs.
		pause    bool
		fails    string // what the run's error says; "" when it succeeds
		closed   bool   // the driver closes the session
		stops    bool   // the driver stops the sandbox itself
		verified bool
	}{
		{name: "checkpointed-verified", pause: true, verified: true},
		{name: "checkpointed-harness-exit-3", extra: map[string]any{"fake": map[string]any{"exit_code": 3}}, verified: true},
		{name: "checkpointed-broken-exec", breakWait: true, fails: "connection dropped", closed: true},
		{name: "checkpointed-check-cannot-run", extra: map[string]any{"check": "true #" + strings.Repeat("x", 200<<10)}, fails: "run the check", closed: true},
		{name: "checkpointed-launch-fails", extra: map[string]any{"fake": map[string]any{"steps": "many"}}, fails: "fake options", closed: true},
		{name: "restart-verified", extra: map[string]any{"restart": true}, stops: true, verified: true},
		{name: "restart-broken-exec", extra: map[string]any{"restart": true}, breakWait: true, fails: "connection dropped", stops: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := drivertest.New(t)
			p := drivertest.NewParticipant()
			rn := e.Runner(drivertest.Fake(steps, stepS), p)
			armed := make(chan struct{})
			arm := sync.OnceFunc(func() { close(armed) })
			if c.breakWait {
				e.Backend.SetHook(failWaits(armed))
			}
			ro := e.Rollout(c.name)
			h := e.Start(rn, ro, 1, drivertest.Task(ro, steps, stepS, c.extra))
			sbID := e.WaitSeeded(ro, 1).SandboxID
			var procs []drivertest.Proc
			if c.name != "checkpointed-launch-fails" {
				procs = e.WaitRunning(h, drivertest.Until{Steps: 1, Kinds: allKinds}).Procs
			}
			if c.pause {
				prepare(t, p, "ckpt-1")
				resume(t, p, "ckpt-1")
			}
			if c.breakWait {
				arm()
			}
			raw, err := h.Wait(t)
			switch {
			case c.fails == "" && err != nil:
				t.Fatalf("the run failed: %v", err)
			case c.fails != "" && (err == nil || !strings.Contains(err.Error(), c.fails)):
				t.Fatalf("the run returned %v, want a failure saying %q", err, c.fails)
			}
			if err == nil {
				r := drivertest.ParseResult(t, raw)
				checkVerified(t, e, ro, r)
				if c.name == "checkpointed-harness-exit-3" {
					if len(r.Launches) != 1 || r.Launches[0].Outcome != driver.OutcomeFailed || r.Launches[0].ExitCode != 3 || r.Fake.Error == "" {
						t.Errorf("want the launch recorded failed with exit code 3 and the response to say so: %s", r.Raw)
					}
				}
			}
			s := e.Session(ro)
			if c.verified && (!s.Closed || !s.Verified) || !c.verified && s.Verified {
				t.Errorf("the owner's session: closed %v verified %v", s.Closed, s.Verified)
			}
			if c.closed && !s.Closed {
				t.Errorf("the session was left open")
			}
			if n := e.Owner.Count(drivertest.CallClose, ro); c.closed && n != 1 || !c.closed && n != 0 {
				t.Errorf("the driver closed the session %d times", n)
			}
			listed := false
			for _, x := range e.Backend.Execs() {
				if x.Sandbox == sbID && len(x.Argv) == 3 && x.Argv[0] == "ls" && strings.HasSuffix(x.Argv[2], "/launches") {
					listed = true
				}
			}
			if listed != c.stops {
				t.Errorf("the driver stopped the sandbox itself: %v, want %v", listed, c.stops)
			}
			if c.breakWait {
				launch := driver.LaunchID(ro, 1, 1, sbID)
				if stops := drivertest.ForLaunch(e.Backend.Verbs("stop"), launch); len(stops) == 0 {
					t.Errorf("the driver did not kill the launch %s of the failed run", launch)
				}
			}
			if !c.breakWait && !c.stops {
				if stops := e.Backend.Verbs("stop"); len(stops) != 0 {
					t.Errorf("the driver ran ngsup stop itself: %v", stops[0].Argv)
				}
			}
			drivertest.CheckGone(t, "after the run", procs)
			e.CheckNoProcs("after the run", sbID)
		})
	}
}

// TestHostileTaskText proves that task text full of shell syntax ($(...),
// backticks, quotes, ';', '&&', '|', '>', newlines, '*', '~', runs of
// spaces) injects nothing: the run verifies, no marker file appears
// anywhere, and the harness got the text as one argument (the fake harness
// echoes it, less '"', '\' and newlines, in its response's "task"). A
// rollout id full of it is refused before anything runs (ErrBadRequest, no
// seed).
func TestHostileTaskText(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	marker := filepath.Join(os.TempDir(), "PWNED-"+e.Tag)
	text := "a  b   $(touch " + marker + "-1) `touch " + marker + "-2`; touch " + marker + "-3 && echo 'q' \"dq\"\nline2 * ~ | tee " + marker + "-4 > " + marker + "-5 \\ end"
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	evil := "evil;$(touch " + marker + "-6)`id`'\"|x-" + e.Tag
	if _, err := e.Start(rn, evil, 1, drivertest.Task(evil, 3, 0.1, nil)).Wait(t); !errors.Is(err, driver.ErrBadRequest) {
		t.Errorf("a rollout id full of shell syntax: %v, want ErrBadRequest", err)
	}
	if n := len(e.Owner.Cookies(evil)); n != 0 {
		t.Errorf("the refused rollout was seeded %d times", n)
	}
	ro := e.Rollout("hostile")
	h := e.Start(rn, ro, 1, drivertest.Task(ro, 3, 0.1, map[string]any{"task": text}))
	r := h.MustSucceed(t)
	checkVerified(t, e, ro, r)
	want := strings.NewReplacer(`"`, "", `\`, "", "\n", "").Replace(text)
	if len(want) > 200 {
		want = want[:200]
	}
	if r.Fake.Task != want {
		t.Errorf("the harness got the task as %q, want it whole as one argument: %q", r.Fake.Task, want)
	}
	if len(r.Launches) != 1 || strings.ContainsAny(r.Launches[0].ID, "$`'\";|() /") {
		t.Errorf("launch ids %+v: want one, in ngsup's id alphabet", r.Launches)
	}
	found, _ := filepath.Glob(marker + "*")
	_ = filepath.WalkDir(e.Local.Base(), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), "PWNED") {
			found = append(found, p)
		}
		return nil
	})
	if len(found) > 0 {
		t.Errorf("the task text ran commands: %v", found)
	}
	e.CheckNoProcs("after verify")
}

// TestSeedHandleWhenTheOwnerHasNoSandboxAccess proves the fallback for an
// owner without /sandbox_access (Gym's main-branch SWE-bench server answers
// it 404 and names the sandbox in its seed reply): the run connects to the
// sandbox the seed's sandbox_handle names, through the only backend
// configured, is not made a restart, and is verified.
func TestSeedHandleWhenTheOwnerHasNoSandboxAccess(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	e.Owner.WithoutSandboxAccess()
	ro := e.Rollout("no-access")
	r := e.Start(e.Runner(drivertest.Fake(3, 0.1), drivertest.NewParticipant()), ro, 1, drivertest.Task(ro, 3, 0.1, nil)).MustSucceed(t)
	sb := e.Session(ro).SandboxID
	if len(r.Launches) != 1 || r.Launches[0].SandboxID != sb {
		t.Fatalf("launches %+v, want one in the seeded sandbox %s", r.Launches, sb)
	}
	if n := e.Owner.Count(drivertest.CallSandboxAccess, ro); n == 0 {
		t.Errorf("the driver never asked /sandbox_access")
	}
	checkVerified(t, e, ro, r)
}
