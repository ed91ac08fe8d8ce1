package gyme2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestCrashRestore: four rows paused in place, one restart row and one
// row queued for a slot are in flight (another returned before). Gym's
// collection checkpoints them: the restart is reported, left out of the
// scope and recorded by nobody; the queued row is exported at its seed
// bookmark. Right after the commit both servers are killed with SIGKILL.
// Fresh processes on the same config are restored as collection.py
// restores a run: the restart row's logged attempt is retired everywhere,
// the continued rows are restored (attempt + 1 everywhere, source the
// checkpoint) and resumed, and each row is posted again with
// _ng_attempt_index + 1. Each paused row continues from its bookmark in a
// fork of its snapshot, after its last step; the queued row starts from
// its seed; the restart row starts over from its input; the returned row
// is not run again; a /run of a superseded or retired attempt is refused
// stale_attempt, and forget lifts the retired one. 0 runs lost, 0
// finished steps repeated.
func TestCrashRestore(t *testing.T) {
	const steps = 12
	// Five slots: the four paused rows and the restart row take them; a
	// sixth row waits in the queue and is exported at its seed bookmark.
	w := newWorld(t, options{steps: steps, maxRuns: 5})
	quick := w.coll.row(0, 0, job{steps: 1, stepS: 0.05})
	if res := w.coll.post(t.Context(), quick).reply(t); res.Reward != 1 {
		t.Fatalf("the quick run: reward %v, want 1", res.Reward)
	}
	var paused []row
	chans := map[string]<-chan runResult{}
	for i := 1; i <= 4; i++ {
		paused = append(paused, w.coll.row(i, 0, job{steps: steps, stepS: 0.3}))
	}
	restart := w.coll.row(5, 0, job{steps: steps, stepS: 0.3, restart: true})
	all := append(slices.Clone(paused), restart)
	var ids []string
	for _, r := range all {
		ids = append(ids, rolloutID(r))
		chans[rolloutID(r)] = w.coll.start(r)
	}
	w.waitSteps(3, ids...)
	queued := w.coll.row(6, 0, job{steps: 3, stepS: 0.1})
	chans[rolloutID(queued)] = w.coll.start(queued)
	testkit.Eventually(t, "the sixth row is taken in and waits for a slot", func() (bool, string) {
		st := w.coord.status(w.coord.member(gym.KindAgent))
		return st.Report.Counts["sessions"] == 6, fmt.Sprintf("counts %v", st.Report.Counts)
	})
	paused = append(paused, queued)
	all = append(all, queued)

	id := ckID("crash")
	ck := w.checkpoint(id, episodes(all...), false)
	restartKey := episode(restart).CaptureKey()
	if inScope(ck.scope, restartKey) || !slices.Contains(ck.prep.restarts(), restartKey) {
		t.Fatalf("the restart row: restarts %q, scope %q; want it reported and left out", ck.prep.restarts(), keysOf(ck.scope))
	}
	if got := keysOf(ck.scope); !slices.Equal(got, keysOf(episodes(paused...))) {
		t.Fatalf("the commit scope is %q, want the four paused rows and the queued one", got)
	}
	var bm struct {
		Next string `json:"next"`
	}
	if err := json.Unmarshal(recordOf(t, ck, agentEntry, episode(queued)).Fields["episode"], &bm); err != nil || bm.Next != "seed" {
		t.Errorf("the queued row was exported at %q (%v), want its seed bookmark", bm.Next, err)
	}
	for name := range ck.records {
		if slices.Contains(ck.keys(name), restartKey) {
			t.Errorf("%s recorded the restart row", name)
		}
	}
	if got := ck.keys(agentEntry); !slices.Equal(got, keysOf(ck.scope)) {
		t.Errorf("the agent recorded %q, want the scope %q", got, keysOf(ck.scope))
	}
	atSnapshot := map[string]int{}
	for _, r := range paused[:4] {
		n := len(e2eproc.SessionSteps(w.base, rolloutID(r)))
		if n == 0 || n >= steps {
			t.Fatalf("%s took %d of %d steps by the checkpoint: nothing would be left to continue", rolloutID(r), n, steps)
		}
		atSnapshot[rolloutID(r)] = n
	}

	w.crash()
	for _, r := range all {
		if res := await(t, chans[rolloutID(r)]); res.err == nil && res.status == http.StatusOK {
			t.Fatalf("%s returned although its servers were killed", res)
		}
	}
	w.startServers()
	deadline := deadlineIn(waitLimit)
	// collection.restore: fence the logged attempt of the row the
	// checkpoint does not continue, then restore and resume the others.
	w.coord.retire("retire", episodes(restart), deadline)
	rid := restoreID()
	for name, rr := range w.coord.restore(rid, ck.dir, ck.scope, deadline) {
		if want := restoredOf(ck, name); rr.SourceCheckpointID != id || !slices.Equal(rr.Restored, want) {
			t.Errorf("%s restore: %+v, want source %s and restored %q (the next attempt of each record)", name, rr, id, want)
		}
	}
	if got := restoredOf(ck, agentEntry); len(got) != len(ck.scope) {
		t.Errorf("the agent restores %q, want every episode of the scope", got)
	}
	for _, m := range w.coord.members {
		if st := w.coord.status(m); st.Phase != gym.PhaseRestored || deref(st.CheckpointID) != rid {
			t.Errorf("%s after restore: phase %s checkpoint %v", m.Name, st.Phase, deref(st.CheckpointID))
		}
		// A retried restore is replayed; another restore id conflicts.
		first := w.coord.to(m, gym.OpRestore, restoreBody(rid, ck.dir, ck.scope, deadline))
		second := w.coord.to(m, gym.OpRestore, restoreBody(rid, ck.dir, ck.scope, deadline))
		if first.status != http.StatusOK || !sameJSON(first.body, second.body) {
			t.Errorf("%s: a retried restore answered %s, then %s", m.Name, first, second)
		}
		checkRefusal(t, w.coord.to(m, gym.OpRestore, restoreBody(restoreID(), ck.dir, ck.scope, deadline)), gym.CodeConflict)
	}
	// Restored, not yet resumed: admission stays closed to new rows.
	if st := w.coord.status(w.coord.member(gym.KindAgent)); st.Accepting == nil || *st.Accepting {
		t.Errorf("the agent after restore: accepting %v, want false until resume", deref(st.Accepting))
	}
	w.coll.post(t.Context(), w.coll.row(9, 0, job{steps: 1, stepS: 0.05})).refusal(t, gym.CodeCheckpointParked)
	w.coord.resume(rid, deadline)

	// A superseded attempt (restored as attempt 1) and the retired one are refused.
	w.coll.post(t.Context(), paused[0]).refusal(t, gym.CodeStaleAttempt)
	w.coll.post(t.Context(), restart).refusal(t, gym.CodeStaleAttempt)
	again := map[string]<-chan runResult{}
	for _, r := range all {
		again[rolloutID(r)] = w.coll.start(nextAttempt(r))
	}
	for _, r := range paused[:4] {
		checkContinued(t, w, rolloutID(r), await(t, again[rolloutID(r)]).reply(t), steps, atSnapshot[rolloutID(r)], true)
	}
	// The queued row continues from its seed bookmark: a first launch.
	checkOneLaunch(t, w, rolloutID(queued), await(t, again[rolloutID(queued)]).reply(t), 3, 0)
	res := await(t, again[rolloutID(restart)]).reply(t)
	if res.Reward != 1 || len(res.Launches) != 1 || res.Launches[0].Resumed {
		t.Errorf("the restart row: reward %v launches %+v, want 1 and one first launch", res.Reward, res.Launches)
	}
	if out := harnessOutput(t, res); out.FirstStep != 1 {
		t.Errorf("the restart row started at step %d, want 1 (from its input)", out.FirstStep)
	}
	// The later attempt of the retired rollout finished: forget it.
	w.coord.forget("forget", []string{rolloutID(restart)}, deadlineIn(waitLimit))
	for _, m := range w.coord.members {
		if st := w.coord.status(m); st.RetiredRollouts != 0 || st.Phase != gym.PhaseIdle {
			t.Errorf("%s after forget: retired_rollouts %d phase %s", m.Name, st.RetiredRollouts, st.Phase)
		}
	}
	if files, _ := filepath.Glob(filepath.Join(w.base, "sandboxes", "*", ".ngharness", "state", "fake", rolloutID(quick)+"-a*")); len(files) != 1 {
		t.Errorf("the row that returned before the checkpoint has %d sessions, want 1 (never run again): %q", len(files), files)
	}
}

// checkContinued checks a row restored from a bookmark taken while its
// launch was paused after done steps: the first launch is recorded
// interrupted after one pause; the second resumed the saved session in a
// fork (another sandbox) and took exactly the steps after done, each once;
// with originKept, the sandbox the first ran in kept the snapshot's steps.
func checkContinued(t *testing.T, w *world, rollout string, res rolloutReply, steps, done int, originKept bool) {
	t.Helper()
	if res.Reward != 1 {
		t.Errorf("%s: reward %v, want 1", rollout, res.Reward)
	}
	if len(res.Launches) != 2 {
		t.Errorf("%s: %d launches, want 2 (the paused one, the relaunch): %+v", rollout, len(res.Launches), res.Launches)
		return
	}
	first, second := res.Launches[0], res.Launches[1]
	if first.Outcome != "interrupted" || first.Pauses != 1 {
		t.Errorf("%s: first launch %+v, want interrupted after 1 pause", rollout, first)
	}
	if !second.Resumed || !strings.Contains(second.Reason, fmt.Sprintf("%d completed steps", done)) || second.Outcome != "finished" {
		t.Errorf("%s: relaunch %+v, want it resumed from %d completed steps and finished", rollout, second, done)
	}
	if second.SandboxID == first.SandboxID || second.SandboxID == "" {
		t.Errorf("%s: relaunched in sandbox %q, want a fork under a new id (was %q)", rollout, second.SandboxID, first.SandboxID)
	}
	if out := harnessOutput(t, res); out.FirstStep != done+1 || out.Steps != steps {
		t.Errorf("%s: the relaunch took steps %d..%d, want %d..%d", rollout, out.FirstStep, out.Steps, done+1, steps)
	}
	for _, c := range []struct {
		sandbox string
		want    []string
	}{{second.SandboxID, fake.StepLines(1, steps)}, {first.SandboxID, fake.StepLines(1, done)}} {
		if c.sandbox == first.SandboxID && !originKept {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(w.base, "sandboxes", c.sandbox, ".ngharness", "state", "fake", rollout+"-a*", "steps"))
		if len(files) != 1 {
			t.Errorf("%s: sandbox %s holds %d sessions, want 1: %q", rollout, c.sandbox, len(files), files)
			continue
		}
		if got, err := fake.ReadSteps(filepath.Dir(files[0])); err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: the session in %s holds %q (%v), want %q", rollout, c.sandbox, got, err, c.want)
		}
	}
}

// restoredOf is what a participant's restore of ck must answer: the next
// attempt of each of its records in the scope, sorted.
func restoredOf(ck ckpt, name string) []string {
	var out []string
	for _, r := range ck.records[name] {
		if inScope(ck.scope, r.Episode.CaptureKey()) {
			out = append(out, r.Episode.Next().CaptureKey())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
