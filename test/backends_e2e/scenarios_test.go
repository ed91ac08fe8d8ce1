package backends_e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/gym"
)

// backends are the backends every scenario runs over; local is the
// control.
var backends = []string{"local", "opensandbox", "docker", "kubectl"}

// forEachBackend runs scenario over every backend, each in a
// drivertest.Env of its own, in parallel. The Envs' backends hide the
// local sandbox's capabilities (drivertest.Backend.HideCapabilities): the
// control runs the remote backends' path, ngsup uploaded into each
// sandbox and each launch paused alone.
func forEachBackend(t *testing.T, scenario func(t *testing.T, e *drivertest.Env)) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := drivertest.NewOn(t, name)
			e.Backend.HideCapabilities()
			scenario(t, e)
		})
	}
}

// task is a run body for the fake adapter and the owner
// (drivertest.Task) with the task text given, and the identity `ngdriver
// serve` reads, as Gym's collector sends it.
func task(rollout, text string, steps int, stepS float64) json.RawMessage {
	return drivertest.Task(rollout, steps, stepS, map[string]any{"task": text, gym.FieldRolloutID: rollout})
}

// start runs body on a new Runner of the Env (its ngsup shared) for p.
func start(e *drivertest.Env, p *driver.Participant, rollout string, body json.RawMessage) *drivertest.Handle {
	return e.Start(e.Runner(drivertest.Fake(0, 0), p), rollout, 1, body)
}

// mustVerify waits for the run to succeed; the test fails at once unless
// the owner verified it (reward 1).
func mustVerify(t testing.TB, h *drivertest.Handle) drivertest.Result {
	t.Helper()
	r := h.MustSucceed(t)
	if r.Reward != 1 {
		t.Fatalf("run %s was not verified: %s", h.Rollout, r.Raw)
	}
	return r
}

// checkLaunch is drivertest.CheckLaunch, and the launch was supervised.
func checkLaunch(t *testing.T, rec driver.LaunchRecord, outcome driver.Outcome, pauses int, resumed bool) {
	t.Helper()
	drivertest.CheckLaunch(t, rec, outcome, pauses, resumed)
	if !rec.Supervised {
		t.Errorf("launch %s was not supervised", rec.ID)
	}
}

// harnesses counts the harness processes a session's pids file recorded
// (one per launch).
func harnesses(dir string) int {
	recs, _ := fake.ReadPids(dir)
	n := 0
	for _, r := range recs {
		if r.Kind == "harness" {
			n++
		}
	}
	return n
}

// TestVerifiedRun proves that a plain rollout runs end to end through each
// backend: the owner lends a sandbox it created through the backend, the
// driver uploads ngsup into it once, launches the fake harness under ngsup,
// follows it with `ngsup wait`, collects its response, and the owner's
// check in the sandbox verifies it; one launch, finished; nothing left
// running.
func TestVerifiedRun(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *drivertest.Env) {
		ro := e.Rollout("plain")
		r := mustVerify(t, start(e, drivertest.NewParticipant(), ro, task(ro, "count", 4, 0.2)))
		if len(r.Launches) != 1 {
			t.Fatalf("want one launch, got %+v", r.Launches)
		}
		checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
		info := e.Session(ro)
		if !info.Verified || !info.Closed || r.Launches[0].SandboxID != info.SandboxID {
			t.Errorf("owner session %+v, launch in %s", info, r.Launches[0].SandboxID)
		}
		if r.Fake.Steps != 4 || r.Fake.FirstStep != 1 {
			t.Errorf("harness output %+v", r.Fake)
		}
		drivertest.CheckStepsOnce(t, e.WaitSession(info.SandboxID, ro), 4)
		if n := e.Backend.NgsupUploads(info.SandboxID); n != 1 {
			t.Errorf("ngsup was uploaded %d times into %s, want once", n, info.SandboxID)
		}
		e.CheckNoProcs("after verify", info.SandboxID)
	})
}

// TestPausedAtCheckpointContinuesInPlace proves that a checkpoint pauses
// the launch in place through the backend (`ngsup pause` by exec), the
// owner snapshots the sandbox through the backend's lifecycle while it is
// held, and the same launch continues: one launch, pauses=1, every step
// once, verified.
func TestPausedAtCheckpointContinuesInPlace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *drivertest.Env) {
		ro := e.Rollout("pause")
		p := drivertest.NewParticipant()
		h := start(e, p, ro, task(ro, "count", 8, 0.4))
		sb := e.WaitSeeded(ro, 1).SandboxID
		dir := e.WaitSession(sb, ro)
		e.WaitSteps(dir, 2)
		c, err := e.Checkpoint(p, "ckpt-1", 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Episodes) != 1 {
			t.Errorf("the checkpoint exported %d records, want 1", len(c.Episodes))
		}
		if snaps := e.Session(ro).Snapshots; snaps["ckpt-1"] == "" {
			t.Errorf("the owner took no snapshot: %v", snaps)
		}
		r := mustVerify(t, h)
		if len(r.Launches) != 1 {
			t.Fatalf("want one launch, got %+v", r.Launches)
		}
		checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
		drivertest.CheckStepsOnce(t, dir, 8)
		if n := harnesses(dir); n != 1 {
			t.Errorf("the harness was started %d times, want once", n)
		}
		e.CheckNoProcs("after verify", sb)
	})
}

// TestCrashRestoresAFork proves the crash path through each backend's
// lifecycle: a checkpoint pauses the launch, the owner snapshots the
// sandbox and the participant commits; the run goes on and the driver
// crashes (nothing cleaned up); the owner restores: it kills what ran in
// the old sandbox and forks the snapshot into a new sandbox; a new driver
// (a new ngsup client, nothing cached) continues the run from its record:
// two launches, the second resumed on its saved session in the fork, every
// step once, verified. The fork already holds ngsup (its snapshot did): it
// is not uploaded again.
func TestCrashRestoresAFork(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *drivertest.Env) {
		ro := e.Rollout("crash")
		body := task(ro, "count", 10, 0.4)
		p1 := drivertest.NewParticipant()
		h1 := start(e, p1, ro, body)
		sb0 := e.WaitSeeded(ro, 1).SandboxID
		dir0 := e.WaitSession(sb0, ro)
		e.WaitSteps(dir0, 2)
		c, err := e.Checkpoint(p1, "ckpt-1", 0)
		if err != nil {
			t.Fatal(err)
		}
		saved := len(drivertest.Steps(dir0))
		e.WaitSteps(dir0, saved+1) // the launch went on after the checkpoint
		h1.Cancel(driver.ErrCrashed)
		if _, err := h1.Wait(t); !errors.Is(err, driver.ErrCrashed) {
			t.Fatalf("the crashed run returned %v", err)
		}
		p2 := drivertest.NewParticipant()
		if err := e.Restore(p2, c); err != nil {
			t.Fatal(err)
		}
		e.CheckNoProcs("the sandbox a restore replaced", sb0)
		sb1 := e.Session(ro).SandboxID
		if sb1 == sb0 {
			t.Fatalf("the restore did not fork a new sandbox (%s)", sb1)
		}
		r := mustVerify(t, e.Start(e.FreshRunner(drivertest.Fake(0, 0), p2), ro, 2, body))
		if len(r.Launches) != 2 {
			t.Fatalf("want two launches, got %+v", r.Launches)
		}
		checkLaunch(t, r.Launches[0], driver.OutcomeInterrupted, 1, false)
		checkLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
		if r.Launches[0].SandboxID != sb0 || r.Launches[1].SandboxID != sb1 {
			t.Errorf("launches in %s and %s, want %s then the fork %s", r.Launches[0].SandboxID, r.Launches[1].SandboxID, sb0, sb1)
		}
		if r.Fake.FirstStep != saved+1 || r.Fake.Steps != 10 {
			t.Errorf("harness output %+v: want the relaunch to go on from step %d", r.Fake, saved+1)
		}
		drivertest.CheckStepsOnce(t, e.WaitSession(sb1, ro), 10)
		if n := e.Backend.NgsupUploads(sb1); n != 0 {
			t.Errorf("ngsup was uploaded %d times into the fork %s, which had it", n, sb1)
		}
		e.CheckNoProcs("after verify", sb1)
	})
}

// TestHostileTaskTextNeverExecuted proves that task text built to break
// out of quotes ($(...), backquotes, quotes, ;, newlines) travels through
// every layer of each backend (the driver's command line, execd's bash -c,
// docker's and kubectl's sh -c, the fakes) as data: the harness receives
// it literally and no command in it runs.
func TestHostileTaskTextNeverExecuted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *drivertest.Env) {
		marker := filepath.Join(t.TempDir(), "pwned")
		text := fmt.Sprintf("$(touch %s) `touch %s` ' \" ; touch %s; exit 9\nnext line \\ $HOME %%s", marker, marker, marker)
		ro := e.Rollout("hostile")
		r := mustVerify(t, start(e, drivertest.NewParticipant(), ro, task(ro, text, 2, 0.1)))
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("the task text ran a command: %s exists", marker)
		}
		// The fake harness echoes the task without '"', '\' and newlines.
		want := strings.NewReplacer(`"`, "", `\`, "", "\n", "").Replace(text)
		if len(want) > 200 {
			want = want[:200]
		}
		if r.Fake.Task != want {
			t.Errorf("the harness got the task as %q, want %q", r.Fake.Task, want)
		}
	})
}

// TestSecondLaunchSkipsUpload proves that ngsup is uploaded once per
// sandbox: a driver that stops and relaunches at a checkpoint launches
// twice in the same sandbox, and uploads ngsup there once.
func TestSecondLaunchSkipsUpload(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *drivertest.Env) {
		ro := e.Rollout("relaunch")
		p := drivertest.NewParticipant()
		rn := e.Runner(drivertest.Fake(0, 0), p)
		no := false
		rn.PauseAtCheckpoints = &no
		h := e.Start(rn, ro, 1, task(ro, "count", 6, 0.3))
		sb := e.WaitSeeded(ro, 1).SandboxID
		dir := e.WaitSession(sb, ro)
		e.WaitSteps(dir, 2)
		if _, err := e.Checkpoint(p, "ckpt-1", 0); err != nil {
			t.Fatal(err)
		}
		r := mustVerify(t, h)
		if len(r.Launches) != 2 || r.Launches[0].SandboxID != sb || r.Launches[1].SandboxID != sb {
			t.Fatalf("want two launches in %s, got %+v", sb, r.Launches)
		}
		checkLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
		if n := e.Backend.NgsupUploads(sb); n != 1 {
			t.Errorf("ngsup was uploaded %d times into %s for two launches, want once", n, sb)
		}
		drivertest.CheckStepsOnce(t, dir, 6)
	})
}

// TestSandboxDeletedMidRun proves that a sandbox deleted behind the
// owner's back (through its service: DELETE /sandboxes, docker rm -f,
// kubectl delete pod) fails its run with an error that names it (for the
// remote backends, sandbox.ErrGone), that the owner's session is closed,
// and that another run going on at the same time is untouched and
// verifies.
func TestSandboxDeletedMidRun(t *testing.T) {
	forEachBackend(t, func(t *testing.T, e *drivertest.Env) {
		victim, other := e.Rollout("victim"), e.Rollout("other")
		p := drivertest.NewParticipant()
		hv := start(e, p, victim, task(victim, "count", 40, 0.5))
		ho := start(e, p, other, task(other, "count", 6, 0.4))
		sb := e.WaitSeeded(victim, 1).SandboxID
		e.WaitSteps(e.WaitSession(sb, victim), 1)
		if err := e.DeleteSandbox(sb); err != nil {
			t.Fatal(err)
		}
		_, err := hv.Wait(t)
		if err == nil {
			t.Fatalf("the run whose sandbox was deleted succeeded")
		}
		if !strings.Contains(err.Error(), sb) {
			t.Errorf("the error does not name the sandbox %s: %v", sb, err)
		}
		if e.Name != "local" && !errors.Is(err, sandbox.ErrGone) {
			t.Errorf("the error is not sandbox.ErrGone: %v", err)
		}
		if info := e.Session(victim); !info.Closed || info.Verified {
			t.Errorf("the victim's session is %+v, want closed unverified", info)
		}
		r := mustVerify(t, ho)
		if len(r.Launches) != 1 {
			t.Errorf("the other run: %+v", r.Launches)
		}
	})
}
