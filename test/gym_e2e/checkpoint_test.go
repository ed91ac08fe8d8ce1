package gyme2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestCheckpointPausedInPlace: four rows in flight and one that returned
// before; Gym's collection checkpoints them (prepare in order, commit the
// rows in flight, resume in reverse). Prepare answers once every run is
// paused at a boundary (report ready, counts sessions = at_boundary = 4,
// accepting false); the agent's and the owner's records are exactly the
// four runs in flight (the returned row's session ended with its verify);
// a row posted while the checkpoint is open is refused checkpoint_parked;
// nothing steps while it is open. After resume, and a second checkpoint
// once every run has moved on, every run finishes in its one launch
// (paused twice) with reward 1 and every step once, and
// /aggregate_metrics over the five replies gives mean/reward 1.
func TestCheckpointPausedInPlace(t *testing.T) {
	const steps = 10
	w := newWorld(t, options{steps: steps})
	quick := w.coll.row(0, 0, job{steps: 1, stepS: 0.05})
	quickRep := w.coll.post(t.Context(), quick).reply(t)
	if quickRep.Reward != 1 {
		t.Fatalf("the quick run: reward %v, want 1", quickRep.Reward)
	}
	var rows []row
	var chans []<-chan runResult
	var ids []string
	for i := 1; i <= 4; i++ {
		r := w.coll.row(i, 0, job{steps: steps, stepS: 0.3})
		rows = append(rows, r)
		ids = append(ids, rolloutID(r))
		chans = append(chans, w.coll.start(r))
	}
	w.waitStepped(ids...)

	id := ckID("paused")
	ck := w.checkpoint(id, episodes(rows...), false)
	agent := w.coord.member(gym.KindAgent)
	for _, name := range []string{agentEntry, ownerEntry} {
		if keys := ck.keys(name); !slices.Equal(keys, keysOf(episodes(rows...))) {
			t.Errorf("%s's records hold %q, want the four runs in flight %q", name, keys, keysOf(episodes(rows...)))
		}
	}
	rep := ck.prep.replies[agentEntry].Report
	if rep.Counts["sessions"] != 4 || rep.Counts["at_boundary"] != 4 || len(rep.Restarts) != 0 {
		t.Errorf("the agent's prepare report %+v, want 4 sessions all at a boundary, no restarts", rep)
	}
	if st := w.coord.status(agent); st.Accepting == nil || *st.Accepting {
		t.Errorf("the agent's status while committed: accepting %v, want false", deref(st.Accepting))
	}
	atCommit := map[string][]string{}
	for _, r := range ids {
		atCommit[r] = e2eproc.SessionSteps(w.base, r)
	}
	late := w.coll.row(9, 0, job{steps: 1, stepS: 0.05})
	w.coll.post(t.Context(), late).refusal(t, gym.CodeCheckpointParked)
	// Paused in place: three steps' time later no session has moved.
	time.Sleep(time.Second)
	for _, r := range ids {
		if got := e2eproc.SessionSteps(w.base, r); !slices.Equal(got, atCommit[r]) {
			t.Errorf("%s stepped while the checkpoint was open: %q, then %q", r, atCommit[r], got)
		}
	}

	resumed := w.coord.resume(id, deadlineIn(waitLimit))
	for name, r := range resumed {
		if r.Idempotent {
			t.Errorf("%s: the first resume of %s answered idempotent", name, id)
		}
	}
	if st := w.coord.status(agent); st.Phase != gym.PhaseIdle || st.Accepting == nil || !*st.Accepting {
		t.Errorf("the agent after resume: %+v, want idle and accepting", st)
	}
	// A second checkpoint once every run has moved on: each is paused in
	// place again, and its bookmark counts both pauses of its launch.
	testkit.Eventually(t, "every run steps after the resume", func() (bool, string) {
		for _, r := range ids {
			if len(e2eproc.SessionSteps(w.base, r)) <= len(atCommit[r]) {
				return false, r + " has not stepped"
			}
		}
		return true, ""
	})
	id2 := ckID("again")
	ck2 := w.checkpoint(id2, episodes(rows...), false)
	for _, r := range rows {
		var bm struct {
			Launches []launch `json:"launches"`
		}
		json.Unmarshal(recordOf(t, ck2, agentEntry, episode(r)).Fields["episode"], &bm)
		if len(bm.Launches) != 1 || bm.Launches[0].Pauses != 2 {
			t.Errorf("%s in the second checkpoint: launches %+v, want its one launch paused twice", rolloutID(r), bm.Launches)
		}
	}
	w.coord.resume(id2, deadlineIn(waitLimit))
	replies := []rolloutReply{quickRep}
	for i, ch := range chans {
		res := await(t, ch).reply(t)
		checkOneLaunch(t, w, ids[i], res, steps, 2)
		replies = append(replies, res)
	}
	agg := w.coll.aggregate(t, append([]row{quick}, rows...), replies)
	if m := meanReward(t, agg); !near(m, 1) {
		t.Errorf("/aggregate_metrics: mean/reward %v, want 1", m)
	}
}

// checkOneLaunch checks a run that finished in its one launch, paused
// pauses times (any number when pauses < 0): reward 1, every step once in
// order, from step 1.
func checkOneLaunch(t *testing.T, w *world, rollout string, res rolloutReply, steps, pauses int) {
	t.Helper()
	if res.Reward != 1 {
		t.Errorf("%s: reward %v, want 1 (every step once, in order)", rollout, res.Reward)
	}
	if len(res.Launches) != 1 {
		t.Errorf("%s: %d launches, want 1: %+v", rollout, len(res.Launches), res.Launches)
	} else if l := res.Launches[0]; l.Resumed || l.Outcome != "finished" || (pauses >= 0 && l.Pauses != pauses) {
		t.Errorf("%s: launch %+v, want a first launch that finished after %d pauses", rollout, l, pauses)
	}
	if got := e2eproc.SessionSteps(w.base, rollout); !slices.Equal(got, fake.StepLines(1, steps)) {
		t.Errorf("%s: the session holds %q, want steps 1..%d once each", rollout, got, steps)
	}
	if out := harnessOutput(t, res); out.FirstStep != 1 || out.Steps != steps {
		t.Errorf("%s: the harness reported steps %d..%d, want 1..%d", rollout, out.FirstStep, out.Steps, steps)
	}
}

// TestReplaysAndFencing: a checkpoint's prepare and commit sent twice with
// the same id answer the same reply (commit from the same manifest, which
// is never rewritten); while it is open, another id is refused
// checkpoint_conflict and an operation of the wrong phase invalid_phase;
// after resume the id is fenced: prepare, commit and renew of it are
// stale_checkpoint and a second resume answers idempotent. The owner
// holds a seed sent while the checkpoint is open until resume. A resume of an
// id no participant saw is idempotent and fences that id too. Each is
// checked on both participants.
func TestReplaysAndFencing(t *testing.T) {
	w := newWorld(t, options{})
	r := w.coll.row(1, 0, job{steps: 8, stepS: 0.3})
	ch := w.coll.start(r)
	w.waitStepped(rolloutID(r))
	id := ckID("fence")
	ck := w.checkpoint(id, episodes(r), false)
	deadline := deadlineIn(waitLimit)
	other := ckID("other")
	for _, m := range w.coord.members {
		again := w.coord.to(m, gym.OpPrepare, plainBody(id, deadline))
		if !sameJSON(again.body, ck.prep.raw[m.Name]) {
			t.Errorf("%s: prepare of %s again answered %s, first %s", m.Name, id, again, ck.prep.raw[m.Name])
		}
		again = w.coord.to(m, gym.OpCommit, commitBody(id, ck.dir, ck.scope, false, deadline))
		if !sameJSON(again.body, ck.commits[m.Name].Raw) {
			t.Errorf("%s: commit of %s again answered %s, first %s", m.Name, id, again, ck.commits[m.Name].Raw)
		}
		checkStore(t, ck.dir, m, ck.commits[m.Name])
		checkRefusal(t, w.coord.to(m, gym.OpPrepare, plainBody(other, deadline)), gym.CodeConflict)
		checkRefusal(t, w.coord.to(m, gym.OpCommit, commitBody(other, w.checkpointDir(other), ck.scope, false, deadline)), gym.CodeConflict)
		checkRefusal(t, w.coord.to(m, gym.OpRestore, restoreBody(id, ck.dir, ck.scope, deadline)), gym.CodeInvalidPhase)
		checkRefusal(t, w.coord.to(m, gym.OpRetire, map[string]any{"checkpoint_id": id, "deadline_ts": deadline,
			"episode_ids": episodeList(ck.scope)}), gym.CodeInvalidPhase)
		checkRefusal(t, w.coord.to(m, gym.OpForget, map[string]any{"checkpoint_id": id, "deadline_ts": deadline,
			"rollout_ids": []string{rolloutID(r)}}), gym.CodeInvalidPhase)
	}
	// The owner holds a seed that arrives while the checkpoint is open
	// until resume (resources.py: it waits instead of being refused).
	heldRow := w.coll.row(7, 0, job{steps: 1, stepS: 0.05})
	held := make(chan reply, 1)
	go func() { held <- w.postOwnerAsync("/ng-rollout/"+rolloutID(heldRow)+"/seed_session", nil, heldRow) }()
	select {
	case r := <-held:
		t.Errorf("%s: answered while the checkpoint was open, want it held until resume", r)
		held <- r
	case <-time.After(2 * time.Second):
	}
	w.coord.resume(id, deadline)
	seeded := <-held
	if seeded.status != http.StatusOK {
		t.Errorf("%s: the held seed after resume, want 200", seeded)
	}
	if r := w.postOwner(t, "/ng-rollout/"+rolloutID(heldRow)+"/close_session", seeded.cookies, map[string]any{}); r.status != http.StatusOK {
		t.Errorf("%s: want 200", r)
	}
	for name, rr := range w.coord.resume(id, deadline) {
		if !rr.Idempotent {
			t.Errorf("%s: the second resume of %s is not idempotent", name, id)
		}
	}
	for _, m := range w.coord.members {
		checkRefusal(t, w.coord.to(m, gym.OpPrepare, plainBody(id, deadline)), gym.CodeStaleCheckpoint)
		checkRefusal(t, w.coord.to(m, gym.OpCommit, commitBody(id, ck.dir, ck.scope, false, deadline)), gym.CodeStaleCheckpoint)
		checkRefusal(t, w.coord.to(m, gym.OpRenew, plainBody(id, deadline)), gym.CodeStaleCheckpoint)
		// Idle: commit and renew of a fresh id are in the wrong phase.
		fresh := ckID(fmt.Sprintf("fresh-%s", m.Kind))
		checkRefusal(t, w.coord.to(m, gym.OpCommit, commitBody(fresh, w.checkpointDir(fresh), nil, false, deadline)), gym.CodeInvalidPhase)
		checkRefusal(t, w.coord.to(m, gym.OpRenew, plainBody(fresh, deadline)), gym.CodeInvalidPhase)
	}
	// A resume of an id nobody prepared (a prepare that stopped at an
	// earlier stage) is idempotent and fences the id.
	never := ckID("never")
	for name, rr := range w.coord.resume(never, deadline) {
		if !rr.Idempotent {
			t.Errorf("%s: resume of the unknown %s is not idempotent", name, never)
		}
	}
	for _, m := range w.coord.members {
		checkRefusal(t, w.coord.to(m, gym.OpPrepare, plainBody(never, deadline)), gym.CodeStaleCheckpoint)
	}
	checkOneLaunch(t, w, rolloutID(r), await(t, ch).reply(t), 8, 1)
}
