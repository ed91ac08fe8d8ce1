package gyme2e

import (
	"net/http"
	"slices"
	"testing"

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
	done := len(w.sessionSteps(rolloutID(a)))
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
	if out, ok := harnessOutput(resB.Response); ok && out.FirstStep != 1 {
		t.Errorf("the row left out of the scope started at step %d, want 1", out.FirstStep)
	}

	w.crash()
	w.startServers()
	rid2 := restoreID()
	for name, rr := range w.coord.restore(rid2, ck2.dir, ck2.scope, deadlineIn(waitLimit)) {
		if want := []string{pendingA.Next().CaptureKey()}; !slices.Equal(rr.Restored, want) {
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
