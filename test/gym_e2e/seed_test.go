package gyme2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestSeedHeldDuringCheckpoint: a run whose seed the owner holds (it
// arrived once the owner's admission had closed; to get there the owner is
// prepared before the agent, after the model as in Gym's order, the one
// step here out of Gym's order, which each participant's wire allows) is
// in a replay step: it
// does not block the agent's prepare and is exported at its seed
// bookmark. Gym resumes in reverse order, the resources server first: the
// held seed then completes while the agent's checkpoint is still open, and
// the run must park at the boundary after it (steps.py: a replay step that
// ends during a checkpoint parks at its next boundary until resume), so no
// harness step is taken until the agent resumes; then it runs to the end.
func TestSeedHeldDuringCheckpoint(t *testing.T) {
	w := newWorld(t, options{})
	model, agent, owner := w.coord.member(gym.KindModel), w.coord.member(gym.KindAgent), w.coord.member(gym.KindResources)
	id := ckID("seed")
	deadline := deadlineIn(waitLimit)
	if p := w.coord.checkPrepare(model, w.coord.to(model, gym.OpPrepare, plainBody(id, deadline))); p.Phase != gym.PhasePrepared {
		t.Fatalf("the model's prepare: %+v", p)
	}
	p := w.coord.checkPrepare(owner, w.coord.to(owner, gym.OpPrepare, plainBody(id, deadline)))
	if p.Phase != gym.PhasePrepared {
		t.Fatalf("the owner's prepare: %+v", p)
	}
	r := w.coll.row(1, 0, job{steps: 3, stepS: 0.05})
	ch := w.coll.start(r)
	testkit.Eventually(t, "the agent has taken the row in", func() (bool, string) {
		st := w.coord.status(agent)
		return st.Report.Counts["sessions"] == 1, fmt.Sprintf("counts %v", st.Report.Counts)
	})
	if p := w.coord.checkPrepare(agent, w.coord.to(agent, gym.OpPrepare, plainBody(id, deadline))); p.Phase != gym.PhasePrepared {
		t.Fatalf("the agent's prepare with a run in its seed: %+v", p)
	}
	commits := w.coord.commit(id, w.checkpointDir(id), episodes(r), false, deadline)
	records := checkStore(t, w.checkpointDir(id), agent, commits[agent.Name])
	var bm struct {
		Next string `json:"next"`
	}
	if len(records) != 1 || json.Unmarshal(records[0].Fields["episode"], &bm) != nil || bm.Next != "seed" {
		t.Errorf("the agent's records %+v, want the run at its seed bookmark", records)
	}
	w.coord.checkResume(w.coord.to(owner, gym.OpResume, plainBody(id, deadline)))
	select {
	case res := <-ch:
		t.Fatalf("%s: the run returned while the agent's checkpoint was open", res)
	case <-time.After(3 * time.Second):
	}
	if got := e2eproc.SessionSteps(w.base, rolloutID(r)); len(got) != 0 {
		t.Errorf("the run took steps %q while the agent's checkpoint was open", got)
	}
	w.coord.checkResume(w.coord.to(agent, gym.OpResume, plainBody(id, deadline)))
	w.coord.checkResume(w.coord.to(model, gym.OpResume, plainBody(id, deadline)))
	checkOneLaunch(t, w, rolloutID(r), await(t, ch).reply(t), 3, 0)
}
