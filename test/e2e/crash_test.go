package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestCrashRestore: a checkpoint is prepared and committed (driver and
// owner, into one checkpoint_dir), then the driver is killed with SIGKILL.
// A new driver on the same config, restored from that checkpoint_dir
// (Gym's: a restore under its own checkpoint id, scoped to the episodes
// the controller continues), answers phase restored with the source
// checkpoint and the capture keys of attempt 1 of every run that had a
// record; the owner, restored from the same folder with the same scope,
// answers the keys of attempt 1 of every session it exported (the paused
// runs': it forks their snapshots) and not the restart run's, which it
// reported it cannot capture. Admission stays closed until
// the resume: a rollout with no record (the restart run) is refused with
// 409 checkpoint_parked, while the restored attempts are admitted, through
// the path /ng-rollout/<id>-a1/run or the body's _ng_attempt_index. Each
// paused run relaunches in the fork with resumed=true and the adapter's
// reason and continues after its last step (no step twice), the run that
// was queued continues from its seed bookmark, the restart run starts over
// once admission reopens, the run that had returned before the checkpoint
// is not run again, and every rollout returns a verified result.
func TestCrashRestore(t *testing.T) {
	const steps = 12
	// Five slots: the four paused runs and the restart run take them, a
	// sixth run waits in the queue and is exported at its seed bookmark.
	e := newEnv(t, options{steps: steps, maxRuns: 5})
	var paused []string
	chans := map[string]<-chan runReply{}
	bodies := map[string]map[string]any{}
	for i := range 4 {
		id := e.rollout(fmt.Sprintf("p%d", i))
		paused = append(paused, id)
		bodies[id] = e.body(id, steps, e.opts.stepS)
	}
	quick := e.rollout("quick")
	bodies[quick] = e.body(quick, 1, 0.05)
	restart := e.rollout("restart")
	bodies[restart] = e.body(restart, steps, e.opts.stepS)
	bodies[restart]["restart"] = true // the owner "cannot capture" it
	// The quick run returns before the checkpoint: it is not lost, and not
	// run again.
	quickRes := postRun(t.Context(), e.ctl.url, "/run", quick, bodies[quick]).result(t)
	checkOneLaunch(t, e, quick, quickRes, 1, 0)
	for id, b := range bodies {
		if id != quick {
			chans[id] = e.startRun("/run", id, b)
		}
	}
	e.waitStepped(append([]string{restart}, paused...)...)
	queued := e.rollout("queued")
	bodies[queued] = e.body(queued, 3, 0.1)
	chans[queued] = e.startRun("/run", queued, bodies[queued])
	testkit.Eventually(t, "the sixth run waits for a slot", func() (bool, string) {
		q, _ := e.scrape().sum("ngdriver_runs", `state="queued"`)
		return q == 1, fmt.Sprintf("%v queued", q)
	})

	// A commit scope naming the restart run is refused (the driver holds
	// none of its state) and commits nothing; Gym's coordinator leaves
	// restarts out, and so does the commit that follows (no scope).
	ck := e.prepareCommit(e.prefix+"-ck1", func(prep prepared) {
		if !slices.Equal(prep.Report.Restarts, []string{restart}) {
			t.Errorf("prepare reported restarts %v, want [%s]", prep.Report.Restarts, restart)
		}
		id := e.prefix + "-ck1"
		dir := filepath.Join(e.dir, "checkpoints", id)
		wantRefused(t, e.ctl.call(t, "commit", commitBody(id, dir, episodes(restart, queued), false)), http.StatusConflict, gym.CodeRestartInScope, restart)
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("a refused commit wrote %s", dir)
		}
		e.wantPhase(t, "prepared")
	})
	if !slices.Equal(ck.ownPrep.Report.Restarts, []string{restart}) {
		t.Errorf("the owner's prepare reported restarts %v, want [%s]", ck.ownPrep.Report.Restarts, restart)
	}
	exported := ck.records
	var ownedKeys []string
	for id := range ck.owned {
		ownedKeys = append(ownedKeys, id)
	}
	slices.Sort(ownedKeys)
	if want := slices.Sorted(slices.Values(paused)); !slices.Equal(ownedKeys, want) {
		t.Errorf("the owner exported the sessions of %v, want the paused runs' %v", ownedKeys, want)
	}
	if _, ok := exported[restart]; ok {
		t.Errorf("the restart run was exported: %s", exported[restart].Bookmark)
	}
	if _, ok := exported[quick]; ok {
		t.Errorf("the run that had returned was exported")
	}
	if b := exported[queued].bookmark(t); b.Next != "seed" || exported[queued].ID.Attempt != 0 {
		t.Errorf("the queued run was exported as %s (attempt %d), want next=seed attempt 0", exported[queued].Bookmark, exported[queued].ID.Attempt)
	}
	atSnapshot := map[string]int{}
	for _, id := range paused {
		if !ck.paused[id] {
			t.Fatalf("%s was not exported paused: %s", id, exported[id].Bookmark)
		}
		atSnapshot[id] = len(e2eproc.SessionSteps(e.base, id))
	}

	e.crashDriver()
	for _, id := range append([]string{restart, queued}, paused...) {
		if r := await(t, chans[id]); r.err == nil && r.status == http.StatusOK {
			t.Fatalf("run %s returned although its driver was killed: %s", id, r)
		}
	}
	e.startDriver()
	// The owner outlived the driver, still committed: the controller ends
	// that checkpoint on it before it restores.
	var ores gym.ResumeReply
	e.own.must(t, "resume", plainBody(ck.id), &ores)
	if ores.Phase != gym.PhaseIdle || ores.Idempotent {
		t.Fatalf("owner resume %s after the crash answered %+v, want idle, not idempotent", ck.id, ores)
	}
	// The controller names the episodes it continues: every rollout of the
	// test (the returned one and the restart have no record, and are not
	// restored).
	var all []string
	for id := range bodies {
		all = append(all, id)
	}
	slices.Sort(all)
	restoreID := e.prefix + "-restore1"
	var restored gym.RestoreReply
	e.ctl.must(t, "restore", restoreBody(restoreID, ck.dir, episodes(all...)), &restored)
	var want []string
	for _, r := range exported {
		want = append(want, r.ID.Next().CaptureKey())
	}
	slices.Sort(want)
	if restored.Phase != gym.PhaseRestored || restored.SourceCheckpointID != ck.id || !slices.Equal(restored.Restored, want) {
		t.Fatalf("the driver's restore answered %+v, want phase restored from %s, restored %v", restored, ck.id, want)
	}
	if h := e.health(); h.Phase != "restored" {
		t.Fatalf("after restore the phase is %q, want restored", h.Phase)
	}
	e.restoreOwner(restoreID, ck.dir, episodes(all...), ck.id, ck.owned)

	// Admission is closed until the resume: the restart run (no record) is
	// refused; the restored attempts are admitted and wait for it.
	rb := withAttempt(bodies[restart], 1)
	r := postRun(t.Context(), e.ctl.url, "/run", restart, rb)
	wantRefused(t, ctlReply{call: "run " + restart, status: r.status, body: r.body}, http.StatusConflict, gym.CodeCheckpointParked)
	// Re-issue every run that had a record: the same body, attempt 1.
	again := map[string]<-chan runReply{}
	for i, id := range append([]string{queued}, paused...) {
		if i%2 == 0 {
			b := withAttempt(bodies[id], 1)
			delete(b, "_ng_rollout_id") // the path alone names it
			delete(b, "_ng_attempt_index")
			again[id] = e.startRun("/ng-rollout/"+id+"-a1/run", id, b)
		} else {
			again[id] = e.startRun("/run", id, withAttempt(bodies[id], 1))
		}
	}
	testkit.Eventually(t, "the restored attempts are admitted while admission is closed", func() (bool, string) {
		h := e.health()
		return h.Runs == len(again), fmt.Sprintf("%d runs registered, want %d", h.Runs, len(again))
	})
	for id, ch := range again {
		select {
		case r := <-ch:
			t.Fatalf("restored %s returned before the resume: %s", id, r)
		default:
		}
	}
	e.resumeAll(restoreID)
	again[restart] = e.startRun("/run", restart, rb)
	for _, id := range paused {
		res := await(t, again[id]).result(t)
		checkContinued(t, e, id, res, steps, atSnapshot[id], exported[id].bookmark(t))
	}
	// The restart run starts over from its input: one launch, from step 1,
	// in a new session.
	res := await(t, again[restart]).result(t)
	if res.Reward != 1 || len(res.Launches) != 1 || res.Fake.FirstStep != 1 || res.Fake.Steps != steps {
		t.Errorf("restart run: %+v, want reward 1, one launch, steps 1..%d", res, steps)
	} else if l := res.Launches[0]; l.ID != driver.LaunchID(restart, 1, 1, l.SandboxID) || l.Resumed || l.Reason != "first launch" || l.Outcome != "finished" || l.Pauses != 0 {
		t.Errorf("restart run: launch %+v, want %s, a first launch that finished, never paused", l, driver.LaunchID(restart, 1, 1, l.SandboxID))
	}
	// The queued run continues from its seed bookmark: a first launch, as
	// attempt 1.
	res = await(t, again[queued]).result(t)
	if res.Reward != 1 || len(res.Launches) != 1 || res.Launches[0].ID != driver.LaunchID(queued, 1, 1, res.Launches[0].SandboxID) || res.Launches[0].Resumed || res.Fake.FirstStep != 1 {
		t.Errorf("queued run: %+v, want reward 1 and one first launch of %s", res, queued)
	}
	if h := e.health(); h.Runs != 0 {
		t.Errorf("/healthz after every run returned: %+v", h)
	}
}

// withAttempt is a copy of a run body naming attempt n of its rollout.
func withAttempt(body map[string]any, n int) map[string]any {
	b := map[string]any{}
	for k, v := range body {
		b[k] = v
	}
	b["_ng_attempt_index"] = n
	return b
}

// checkContinued checks a run restored from a bookmark taken while its
// launch was paused after done steps, continued as attempt 1: the first
// launch (attempt 0's) is recorded interrupted after one pause, the second
// (attempt 1's) resumed the saved session in the fork (a new sandbox) and
// took exactly the steps after done, each once.
func checkContinued(t *testing.T, e *env, id string, res result, steps, done int, bm bookmark) {
	t.Helper()
	if res.Reward != 1 || res.FailureKind != "" {
		t.Errorf("%s: reward %v failure %q %q, want 1", id, res.Reward, res.FailureKind, res.FailureReason)
	}
	if len(res.Launches) != 2 {
		t.Errorf("%s: %d launches, want 2 (the paused one, the relaunch): %+v", id, len(res.Launches), res.Launches)
		return
	}
	first, second := res.Launches[0], res.Launches[1]
	if first.ID != driver.LaunchID(id, 0, 1, first.SandboxID) || first.Outcome != "interrupted" || first.Pauses != 1 {
		t.Errorf("%s: first launch %+v, want %s interrupted after 1 pause", id, first, driver.LaunchID(id, 0, 1, first.SandboxID))
	}
	wantReason := fmt.Sprintf("the saved session holds %d completed steps", done)
	if second.ID != driver.LaunchID(id, 1, 2, second.SandboxID) || !second.Resumed || second.Reason != wantReason || second.Outcome != "finished" || second.Pauses != 0 {
		t.Errorf("%s: relaunch %+v, want %s resumed (%q), finished", id, second, driver.LaunchID(id, 1, 2, second.SandboxID), wantReason)
	}
	if second.SandboxID == first.SandboxID || second.SandboxID == "" {
		t.Errorf("%s: relaunched in sandbox %q, want a fork under a new id (was %q)", id, second.SandboxID, first.SandboxID)
	}
	if res.Fake.FirstStep != done+1 || res.Fake.Steps != steps {
		t.Errorf("%s: harness output %+v, want steps %d..%d taken by the relaunch", id, res.Response, done+1, steps)
	}
	// The fork's saved session: every step once, in order. The sandbox the
	// paused launch ran in kept the snapshot's steps: that launch never went
	// on after the crash (the owner's restore stopped it).
	for _, c := range []struct {
		sandbox string
		want    []string
	}{{second.SandboxID, fake.StepLines(1, steps)}, {first.SandboxID, fake.StepLines(1, done)}} {
		got, err := fake.ReadSteps(filepath.Join(e.base, "sandboxes", c.sandbox, hostRel(bm.State.SessionDir, e.base, first.SandboxID)))
		if err != nil {
			t.Errorf("%s: the session in %s: %v", id, c.sandbox, err)
		} else if !slices.Equal(got, c.want) {
			t.Errorf("%s: the session in %s holds %q, want %q", id, c.sandbox, got, c.want)
		}
	}
}

// hostRel is a path inside a sandbox made relative to the sandbox's
// folder: /sandbox/... with namespace isolation, the host folder without.
func hostRel(p, base, sandboxID string) string {
	if rel, ok := strings.CutPrefix(p, "/sandbox/"); ok {
		return rel
	}
	rel, _ := strings.CutPrefix(p, filepath.Join(base, "sandboxes", sandboxID)+"/")
	return rel
}
