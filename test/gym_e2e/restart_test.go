package gyme2e

import (
	"slices"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestRestartRuns: a row whose seed reply said x-ng-checkpoint-restart: 1
// is a restart: the agent reports it in report.restarts, it never blocks a
// prepare (the checkpoint is prepared while it keeps running and
// stepping), a commit whose scope names it is refused restart_in_scope,
// a commit past its deadline is refused deadline_exceeded, and the commit
// Gym's collection sends (the scope without the restarts)
// records the other row only. After resume both finish with every step
// once: the paused one after one pause, the restart never paused.
func TestRestartRuns(t *testing.T) {
	const steps = 12
	w := newWorld(t, options{steps: steps})
	paused := w.coll.row(1, 0, job{steps: steps, stepS: 0.3})
	restart := w.coll.row(2, 0, job{steps: steps, stepS: 0.3, restart: true})
	chP, chR := w.coll.start(paused), w.coll.start(restart)
	w.waitStepped(rolloutID(paused), rolloutID(restart))

	id := ckID("restart")
	deadline := deadlineIn(waitLimit)
	prep := w.coord.prepare(id, deadline)
	if !prep.prepared {
		t.Fatalf("prepare with a restart run in flight: %+v", prep.replies)
	}
	agent := w.coord.member(gym.KindAgent)
	key := episode(restart).CaptureKey()
	if rep := prep.replies[agentEntry].Report; !slices.Equal(rep.Restarts, []string{key}) || slices.Contains(rep.Blockers, key) {
		t.Errorf("the agent's report %+v, want restarts [%s] and no blocker", rep, key)
	}
	// The restart keeps running while the checkpoint is open.
	before := len(e2eproc.SessionSteps(w.base, rolloutID(restart)))
	testkit.Eventually(t, "the restart run steps while prepared", func() (bool, string) {
		n := len(e2eproc.SessionSteps(w.base, rolloutID(restart)))
		return n > before || n == steps, "no step since prepare"
	})
	all := episodes(paused, restart)
	checkRefusal(t, w.coord.to(agent, gym.OpCommit, commitBody(id, w.checkpointDir(id), all, false, deadline)), gym.CodeRestartInScope)
	if st := w.coord.status(agent); st.Phase != gym.PhasePrepared {
		t.Errorf("the agent after a refused commit: phase %s, want prepared", st.Phase)
	}
	// A commit whose deadline has passed is refused and changes nothing: a
	// retry with time left commits.
	for _, m := range w.coord.members {
		checkRefusal(t, w.coord.to(m, gym.OpCommit, commitBody(id, w.checkpointDir(id), prep.continued(all), false, deadlineIn(-time.Second))), gym.CodeDeadlineExceeded)
	}
	scope := prep.continued(all)
	if got := keysOf(scope); !slices.Equal(got, keysOf(episodes(paused))) {
		t.Fatalf("the collection's scope %q, want only the paused row", got)
	}
	commits := w.coord.commit(id, w.checkpointDir(id), scope, false, deadline)
	for _, m := range w.coord.members {
		recs := checkStore(t, w.checkpointDir(id), m, commits[m.Name])
		for _, r := range recs {
			if r.Episode.CaptureKey() == key {
				t.Errorf("%s recorded the restart run", m.Name)
			}
		}
	}
	w.coord.resume(id, deadline)
	checkOneLaunch(t, w, rolloutID(paused), await(t, chP).reply(t), steps, 1)
	checkOneLaunch(t, w, rolloutID(restart), await(t, chR).reply(t), steps, 0)
}
