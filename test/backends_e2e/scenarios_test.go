package backends_e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// forEachBackend runs scenario over every backend, each in a world of its
// own, in parallel.
func forEachBackend(t *testing.T, scenario func(t *testing.T, w *world)) {
	for _, name := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			scenario(t, newWorld(t, name))
		})
	}
}

func checkLaunch(t *testing.T, rec driver.LaunchRecord, outcome driver.Outcome, pauses int, resumed bool) {
	t.Helper()
	if rec.Outcome != outcome || rec.Pauses != pauses || rec.Resumed != resumed || !rec.Supervised {
		t.Errorf("launch %s: outcome %s pauses %d resumed %v supervised %v, want %s %d %v true",
			rec.ID, rec.Outcome, rec.Pauses, rec.Resumed, rec.Supervised, outcome, pauses, resumed)
	}
}

// TestVerifiedRun proves that a plain rollout runs end to end through each
// backend: the owner lends a sandbox it created through the backend, the
// driver uploads ngsup into it once, launches the fake harness under ngsup,
// follows it with `ngsup wait`, collects its response, and the owner's
// check in the sandbox verifies it; one launch, finished; nothing left
// running.
func TestVerifiedRun(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		ro := w.rollout("plain")
		h := w.start(w.runner(newParticipant(), nil), ro, 1, task(ro, "count", 4, 0.2))
		r := h.mustSucceed(t)
		if len(r.Launches) != 1 {
			t.Fatalf("want one launch, got %+v", r.Launches)
		}
		checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
		info := w.session(ro)
		if !info.Verified || !info.Closed || r.Launches[0].SandboxID != info.SandboxID {
			t.Errorf("owner session %+v, launch in %s", info, r.Launches[0].SandboxID)
		}
		if r.Fake.Steps != 4 || r.Fake.FirstStep != 1 {
			t.Errorf("harness output %+v", r.Fake)
		}
		checkStepsOnce(t, w.sessionDir(info.SandboxID, ro), 4)
		if n := w.rec.ngsupUploads(info.SandboxID); n != 1 {
			t.Errorf("ngsup was uploaded %d times into %s, want once", n, info.SandboxID)
		}
		w.checkNoProcs("after verify", info.SandboxID)
	})
}

// TestPausedAtCheckpointContinuesInPlace proves that a checkpoint pauses
// the launch in place through the backend (`ngsup pause` by exec), the
// owner snapshots the sandbox through the backend's lifecycle while it is
// held, and the same launch continues: one launch, pauses=1, every step
// once, verified.
func TestPausedAtCheckpointContinuesInPlace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		ro := w.rollout("pause")
		p := newParticipant()
		h := w.start(w.runner(p, nil), ro, 1, task(ro, "count", 8, 0.4))
		sb := w.session(ro).SandboxID
		dir := w.sessionDir(sb, ro)
		waitSteps(t, dir, 2)
		c, err := w.checkpoint(p, "ckpt-1", 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Episodes) != 1 {
			t.Errorf("the checkpoint exported %d records, want 1", len(c.Episodes))
		}
		if snaps := w.session(ro).Snapshots; snaps["ckpt-1"] == "" {
			t.Errorf("the owner took no snapshot: %v", snaps)
		}
		r := h.mustSucceed(t)
		if len(r.Launches) != 1 {
			t.Fatalf("want one launch, got %+v", r.Launches)
		}
		checkLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
		checkStepsOnce(t, dir, 8)
		if n := harnesses(dir); n != 1 {
			t.Errorf("the harness was started %d times, want once", n)
		}
		w.checkNoProcs("after verify", sb)
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
	forEachBackend(t, func(t *testing.T, w *world) {
		ro := w.rollout("crash")
		body := task(ro, "count", 10, 0.4)
		p1 := newParticipant()
		h1 := w.start(w.runner(p1, nil), ro, 1, body)
		sb0 := w.session(ro).SandboxID
		dir0 := w.sessionDir(sb0, ro)
		waitSteps(t, dir0, 2)
		c, err := w.checkpoint(p1, "ckpt-1", 0)
		if err != nil {
			t.Fatal(err)
		}
		saved := len(fake.Steps(dir0))
		waitSteps(t, dir0, saved+1) // the launch went on after the checkpoint
		h1.cancel(driver.ErrCrashed)
		if _, err := h1.wait(t); !errors.Is(err, driver.ErrCrashed) {
			t.Fatalf("the crashed run returned %v", err)
		}
		p2 := newParticipant()
		if err := w.restore(p2, c); err != nil {
			t.Fatal(err)
		}
		w.checkNoProcs("the sandbox a restore replaced", sb0)
		sb1 := w.session(ro).SandboxID
		if sb1 == sb0 {
			t.Fatalf("the restore did not fork a new sandbox (%s)", sb1)
		}
		r := w.start(w.runner(p2, nil), ro, 2, body).mustSucceed(t)
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
		checkStepsOnce(t, w.sessionDir(sb1, ro), 10)
		if n := w.rec.ngsupUploads(sb1); n != 0 {
			t.Errorf("ngsup was uploaded %d times into the fork %s, which had it", n, sb1)
		}
		w.checkNoProcs("after verify", sb1)
	})
}

// TestHostileTaskTextNeverExecuted proves that task text built to break
// out of quotes ($(...), backquotes, quotes, ;, newlines) travels through
// every layer of each backend (the driver's command line, execd's bash -c,
// docker's and kubectl's sh -c, the fakes) as data: the harness receives
// it literally and no command in it runs.
func TestHostileTaskTextNeverExecuted(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		marker := filepath.Join(t.TempDir(), "pwned")
		text := fmt.Sprintf("$(touch %s) `touch %s` ' \" ; touch %s; exit 9\nnext line \\ $HOME %%s", marker, marker, marker)
		ro := w.rollout("hostile")
		r := w.start(w.runner(newParticipant(), nil), ro, 1, task(ro, text, 2, 0.1)).mustSucceed(t)
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
	forEachBackend(t, func(t *testing.T, w *world) {
		ro := w.rollout("relaunch")
		p := newParticipant()
		rn := w.runner(p, nil)
		no := false
		rn.PauseAtCheckpoints = &no
		h := w.start(rn, ro, 1, task(ro, "count", 6, 0.3))
		sb := w.session(ro).SandboxID
		dir := w.sessionDir(sb, ro)
		waitSteps(t, dir, 2)
		if _, err := w.checkpoint(p, "ckpt-1", 0); err != nil {
			t.Fatal(err)
		}
		r := h.mustSucceed(t)
		if len(r.Launches) != 2 || r.Launches[0].SandboxID != sb || r.Launches[1].SandboxID != sb {
			t.Fatalf("want two launches in %s, got %+v", sb, r.Launches)
		}
		checkLaunch(t, r.Launches[1], driver.OutcomeFinished, 0, true)
		if n := w.rec.ngsupUploads(sb); n != 1 {
			t.Errorf("ngsup was uploaded %d times into %s for two launches, want once", n, sb)
		}
		checkStepsOnce(t, dir, 6)
	})
}

// TestSandboxDeletedMidRun proves that a sandbox deleted behind the
// owner's back (through its service: DELETE /sandboxes, docker rm -f,
// kubectl delete pod) fails its run with an error that names it (for the
// remote backends, sandbox.ErrGone), that the owner's session is closed,
// and that another run going on at the same time is untouched and
// verifies.
func TestSandboxDeletedMidRun(t *testing.T) {
	forEachBackend(t, func(t *testing.T, w *world) {
		victim, other := w.rollout("victim"), w.rollout("other")
		p := newParticipant()
		hv := w.start(w.runner(p, nil), victim, 1, task(victim, "count", 40, 0.5))
		ho := w.start(w.runner(p, nil), other, 1, task(other, "count", 6, 0.4))
		sb := w.session(victim).SandboxID
		waitSteps(t, w.sessionDir(sb, victim), 1)
		if err := w.del(sb); err != nil {
			t.Fatal(err)
		}
		_, err := hv.wait(t)
		if err == nil {
			t.Fatalf("the run whose sandbox was deleted succeeded")
		}
		if !strings.Contains(err.Error(), sb) {
			t.Errorf("the error does not name the sandbox %s: %v", sb, err)
		}
		if w.name != "local" && !errors.Is(err, sandbox.ErrGone) {
			t.Errorf("the error is not sandbox.ErrGone: %v", err)
		}
		if info := w.session(victim); !info.Closed || info.Verified {
			t.Errorf("the victim's session is %+v, want closed unverified", info)
		}
		r := ho.mustSucceed(t)
		if len(r.Launches) != 1 {
			t.Errorf("the other run: %+v", r.Launches)
		}
	})
}
