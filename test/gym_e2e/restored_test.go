package gyme2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestCheckpointBeforeReplacement: after a crash and a restore, a second
// checkpoint comes before the replacement rows are posted. Its scope names
// one restored episode by its replacement attempt (what coordination.commit
// asks) and leaves the other out. The agent exports the restored episode
// under attempt 1 with the bookmark it was restored at, and deletes the
// other's restored state without refusing its attempt: that row, posted as
// attempt 1, starts over from its input. After a second crash the first
// row is restored from the second checkpoint as attempt 2 and continues
// from the first checkpoint's bookmark: still no step twice.
func TestCheckpointBeforeReplacement(t *testing.T) {
	const steps = 10
	w := newWorld(t, options{steps: steps})
	a, b := w.coll.row(1, 0, job{steps: steps, stepS: 0.3}), w.coll.row(2, 0, job{steps: steps, stepS: 0.3})
	chA, chB := w.coll.start(a), w.coll.start(b)
	w.waitSteps(3, rolloutID(a), rolloutID(b))
	ck1 := w.checkpoint(ckID("first"), episodes(a, b), false)
	done := len(e2eproc.SessionSteps(w.base, rolloutID(a)))
	if done == 0 || done >= steps {
		t.Fatalf("%s took %d of %d steps by the checkpoint", rolloutID(a), done, steps)
	}
	w.crash()
	for _, ch := range []<-chan runResult{chA, chB} {
		if res := await(t, ch); res.err == nil && res.status == http.StatusOK {
			t.Fatalf("%s returned although its servers were killed", res)
		}
	}
	w.startServers()
	rid := restoreID()
	w.coord.restore(rid, ck1.dir, ck1.scope, deadlineIn(waitLimit))
	w.coord.resume(rid, deadlineIn(waitLimit))

	pendingA := episode(a).Next()
	ck2 := w.checkpoint(ckID("second"), []gym.EpisodeID{pendingA}, false)
	if got := ck2.keys(agentEntry); !slices.Equal(got, []string{pendingA.CaptureKey()}) {
		t.Fatalf("the second checkpoint's agent records %q, want only %s", got, pendingA.CaptureKey())
	}
	first := recordOf(t, ck1, agentEntry, episode(a))
	second := recordOf(t, ck2, agentEntry, pendingA)
	if !sameJSON(first.Fields["episode"], second.Fields["episode"]) || !sameJSON(first.Fields["session"], second.Fields["session"]) {
		t.Errorf("the restored episode was exported as\n%s\n%s\nwant the bookmark it was restored at\n%s\n%s",
			second.Fields["episode"], second.Fields["session"], first.Fields["episode"], first.Fields["session"])
	}
	w.coord.resume(ck2.id, deadlineIn(waitLimit))
	resB := w.coll.post(t.Context(), nextAttempt(b)).reply(t)
	if resB.Reward != 1 || len(resB.Launches) != 1 || resB.Launches[0].Resumed {
		t.Errorf("the row left out of the scope, posted as attempt 1: reward %v launches %+v, want a fresh start", resB.Reward, resB.Launches)
	}
	if out := harnessOutput(t, resB); out.FirstStep != 1 {
		t.Errorf("the row left out of the scope started at step %d, want 1", out.FirstStep)
	}

	w.crash()
	w.startServers()
	rid2 := restoreID()
	for name, rr := range w.coord.restore(rid2, ck2.dir, ck2.scope, deadlineIn(waitLimit)) {
		if want := restoredBy(name, pendingA.Next().CaptureKey()); !slices.Equal(rr.Restored, want) {
			t.Errorf("%s: the second restore restored %q, want %q", name, rr.Restored, want)
		}
	}
	w.coord.resume(rid2, deadlineIn(waitLimit))
	twice := nextAttempt(nextAttempt(a))
	checkContinued(t, w, rolloutID(a), w.coll.post(t.Context(), twice).reply(t), steps, done, true)
}

// recordOf is the record of episode id in a participant's records.
func recordOf(t *testing.T, ck ckpt, name string, id gym.EpisodeID) storedRecord {
	t.Helper()
	for _, r := range ck.records[name] {
		if r.Episode == id {
			return r
		}
	}
	t.Fatalf("%s holds no record of %s in %s", name, id.CaptureKey(), ck.id)
	return storedRecord{}
}

// TestRestoreAllOrNothing: after a crash, the restore fails on one
// participant (its records no longer match their digest: 422
// invalid_checkpoint_state) and succeeds on the other; each way round.
// Gym's coordination.restore then retires the replacement attempts
// everywhere, which frees the restored state (no session is left on
// either), and resumes everyone. Nothing continues from the partial restore:
// the replacement attempt is refused stale_attempt, and the row starts over
// from its input one attempt later.
func TestRestoreAllOrNothing(t *testing.T) {
	for _, failing := range []string{gym.KindResources, gym.KindAgent} {
		t.Run(failing+" fails", func(t *testing.T) { restoreAllOrNothing(t, failing) })
	}
}

func restoreAllOrNothing(t *testing.T, failing string) {
	const steps = 8
	w := newWorld(t, options{steps: steps})
	r := w.coll.row(1, 0, job{steps: steps, stepS: 0.3})
	ch := w.coll.start(r)
	w.waitSteps(2, rolloutID(r))
	ck := w.checkpoint(ckID("partial"), episodes(r), false)
	w.crash()
	if res := await(t, ch); res.err == nil && res.status == http.StatusOK {
		t.Fatalf("%s returned although its servers were killed", res)
	}
	bad := w.coord.member(failing)
	recordsFile, _ := ck.commits[bad.Name].Manifest["records_file"].(string)
	path := filepath.Join(ck.dir, "gym", bad.Kind, bad.Instance, recordsFile)
	if err := os.WriteFile(path, []byte("{\"episode_id\": {\"rollout_id\": \"1-0\", \"attempt\": 0}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.startServers()
	// The other participant holding the run's records (the model holds
	// none: the fake harness calls no model).
	good := w.coord.member(gym.KindAgent)
	if good.Kind == failing {
		good = w.coord.member(gym.KindResources)
	}
	rid := restoreID()
	deadline := deadlineIn(waitLimit)
	replies := w.coord.fanOut(w.coord.members, gym.OpRestore, restoreBody(rid, ck.dir, ck.scope, deadline))
	checkRefusal(t, replies[bad.Name], gym.CodeCheckpointState)
	if rr := w.coord.checkRestore(replies[good.Name]); !slices.Equal(rr.Restored, []string{episode(r).Next().CaptureKey()}) {
		t.Errorf("%s's restore %+v", good.Name, rr)
	}
	// coordination.restore's cleanup.
	next := []gym.EpisodeID{episode(r).Next()}
	w.coord.retire(rid, next, deadline)
	resumed := w.coord.resume(rid, deadline)
	if resumed[good.Name].Idempotent || !resumed[bad.Name].Idempotent {
		t.Errorf("the cleanup's resume: %+v, want %s resumed and %s (never restored) idempotent", resumed, good.Name, bad.Name)
	}
	for _, m := range w.coord.members {
		if st := w.coord.status(m); st.Phase != gym.PhaseIdle || st.RetiredRollouts != 1 || st.Report.Counts["sessions"] != 0 {
			t.Errorf("%s after the failed restore: %+v, want idle, 1 retired rollout, no session", m.Name, st)
		}
	}
	w.coll.post(t.Context(), nextAttempt(r)).refusal(t, gym.CodeStaleAttempt)
	res := w.coll.post(t.Context(), nextAttempt(nextAttempt(r))).reply(t)
	checkOneLaunch(t, w, rolloutID(r), res, steps, 0)
	w.coord.forget("forget", []string{rolloutID(r)}, deadlineIn(waitLimit))
}

// TestCrashMidReplayVerify: a row whose seed reply allowed its verify to
// be replayed (verify_mode replay) is in its verify when the checkpoint
// comes. It holds up neither the prepare nor the commit, and it is
// exported at the bookmark taken before the verify; when the verify ends
// during the checkpoint the run parks, its reply held. After a crash and a
// restore its replacement replays the verify in the fork: the harness is
// not run again, and the verdict is reward 1.
func TestCrashMidReplayVerify(t *testing.T) {
	w := newWorld(t, options{})
	r := w.coll.row(1, 0, job{steps: 2, stepS: 0.05})
	r["verify_mode"] = "replay"
	r["check"] = `touch verify-started && sleep 5 && [ "$(cat progress)" = "$(seq -f 'step %g' 1 2)" ] && touch verify-done`
	ch := w.coll.start(r)
	testkit.Eventually(t, "the row's verify has started", func() (bool, string) {
		return w.findInSandboxes("verify-started"), "no verify-started marker"
	})
	ck := w.checkpoint(ckID("verify"), episodes(r), false)
	// A replayable verify holds up nothing (resources.py leaves it out of
	// the requests a checkpoint waits for): the commit is done before it.
	if w.findInSandboxes("verify-done") {
		t.Errorf("the checkpoint waited for the replay-mode verify to end (a judge verify of minutes would hold every commit)")
	}
	var bm struct {
		Next string `json:"next"`
	}
	if err := json.Unmarshal(recordOf(t, ck, agentEntry, episode(r)).Fields["episode"], &bm); err != nil || bm.Next != "verify" {
		t.Errorf("the row in its replay verify was exported at %q (%v), want its verify bookmark", bm.Next, err)
	}
	// The verify ends while the checkpoint is open: the run parks at the
	// boundary after it (steps.py), its reply held until resume.
	testkit.Eventually(t, "the first verify has ended", func() (bool, string) {
		return w.findInSandboxes("verify-done"), "no verify-done marker"
	})
	select {
	case res := <-ch:
		t.Errorf("%s was delivered while the checkpoint that exported the row at its verify was open", res)
		ch = nil
	case <-time.After(3 * time.Second):
	}
	w.crash()
	if ch != nil {
		if res := await(t, ch); res.err == nil && res.status == http.StatusOK {
			t.Errorf("%s returned although its servers were killed", res)
		}
	}
	w.startServers()
	rid := restoreID()
	w.coord.restore(rid, ck.dir, ck.scope, deadlineIn(waitLimit))
	w.coord.resume(rid, deadlineIn(waitLimit))
	res := w.coll.post(t.Context(), nextAttempt(r)).reply(t)
	if res.Reward != 1 || len(res.Launches) != 1 || res.Launches[0].Outcome != "finished" {
		t.Errorf("the replayed verify: reward %v launches %+v, want 1 and the one launch that finished before", res.Reward, res.Launches)
	}
	if got := e2eproc.SessionSteps(w.base, rolloutID(r)); !slices.Equal(got, fake.StepLines(1, 2)) {
		t.Errorf("the session holds %q, want steps 1..2 once each", got)
	}
}

// TestRestorePreviousCheckpoint: one row is checkpointed four times, each
// time paused in place and resumed. Then a fifth checkpoint is committed
// but never published (Gym's collection points LATEST at a checkpoint only
// after every commit succeeded) and both servers are killed. The rerun
// restores the fourth, the latest published: the row continues from that
// bookmark in a fork of that snapshot, with every step once; its first
// launch counts the four pauses that bookmark knew of.
func TestRestorePreviousCheckpoint(t *testing.T) {
	const steps = 24
	w := newWorld(t, options{steps: steps})
	r := w.coll.row(1, 0, job{steps: steps, stepS: 0.3})
	ch := w.coll.start(r)
	var published ckpt
	var done int
	for i := 1; i <= 5; i++ {
		before := len(e2eproc.SessionSteps(w.base, rolloutID(r)))
		w.waitSteps(before+1, rolloutID(r))
		ck := w.checkpoint(ckID(fmt.Sprintf("n%d", i)), episodes(r), false)
		if i == 5 {
			break
		}
		published, done = ck, len(e2eproc.SessionSteps(w.base, rolloutID(r)))
		w.coord.resume(ck.id, deadlineIn(waitLimit))
	}
	if done >= steps-1 {
		t.Fatalf("the row took %d of %d steps by the fourth checkpoint: nothing left to continue", done, steps)
	}
	w.crash()
	if res := await(t, ch); res.err == nil && res.status == http.StatusOK {
		t.Fatalf("%s returned although its servers were killed", res)
	}
	w.startServers()
	rid := restoreID()
	for name, rr := range w.coord.restore(rid, published.dir, published.scope, deadlineIn(waitLimit)) {
		if rr.SourceCheckpointID != published.id {
			t.Errorf("%s restored from %s, want %s", name, rr.SourceCheckpointID, published.id)
		}
	}
	w.coord.resume(rid, deadlineIn(waitLimit))
	res := w.coll.post(t.Context(), nextAttempt(r)).reply(t)
	if len(res.Launches) == 2 && res.Launches[0].Pauses != 4 {
		t.Errorf("the first launch counts %d pauses, want the 4 its bookmark in the fourth checkpoint knew", res.Launches[0].Pauses)
	}
	if res.Reward != 1 || len(res.Launches) != 2 || !res.Launches[1].Resumed {
		t.Errorf("after the restore: reward %v launches %+v, want 1 and a resumed second launch", res.Reward, res.Launches)
	}
	if out := harnessOutput(t, res); out.FirstStep != done+1 {
		t.Errorf("the relaunch started at step %d, want %d (after the fourth checkpoint's %d)", out.FirstStep, done+1, done)
	}
	files, _ := filepath.Glob(filepath.Join(w.base, "sandboxes", res.Launches[len(res.Launches)-1].SandboxID, ".ngharness", "state", "fake", rolloutID(r)+"-a*", "steps"))
	if len(files) != 1 {
		t.Fatalf("the relaunch's sandbox holds sessions %q, want 1", files)
	}
	if got, _ := fake.ReadSteps(filepath.Dir(files[0])); !slices.Equal(got, fake.StepLines(1, steps)) {
		t.Errorf("the fork's session holds %q, want steps 1..%d once each", got, steps)
	}
}

// TestReplayVerifyHeldUntilResume: a row's replay-mode verify ends while
// the checkpoint that exported it at its verify bookmark is open; its
// /run reply is held (the run parks at its return bookmark) and delivered
// once the checkpoint resumes, with its verdict.
func TestReplayVerifyHeldUntilResume(t *testing.T) {
	w := newWorld(t, options{})
	r := w.coll.row(1, 0, job{steps: 2, stepS: 0.05})
	r["verify_mode"] = "replay"
	r["check"] = `touch verify-started && sleep 3 && [ "$(cat progress)" = "$(seq -f 'step %g' 1 2)" ] && touch verify-done`
	ch := w.coll.start(r)
	testkit.Eventually(t, "the row's verify has started", func() (bool, string) {
		return w.findInSandboxes("verify-started"), "no verify-started marker"
	})
	ck := w.checkpoint(ckID("held"), episodes(r), false)
	testkit.Eventually(t, "the verify has ended", func() (bool, string) {
		return w.findInSandboxes("verify-done"), "no verify-done marker"
	})
	select {
	case res := <-ch:
		t.Fatalf("%s was delivered while the checkpoint was open", res)
	case <-time.After(2 * time.Second):
	}
	w.coord.resume(ck.id, deadlineIn(waitLimit))
	checkOneLaunch(t, w, rolloutID(r), await(t, ch).reply(t), 2, 0)
}
