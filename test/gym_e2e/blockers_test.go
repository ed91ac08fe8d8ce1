package gyme2e

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestPrepareMissesDeadline: a run in a wait-mode verify (the owner's
// default) is between boundaries. A prepare whose deadline passes first
// answers 200 with phase preparing, the run's capture key as its one
// blocker and ready false, and leaves admission closed (accepting false, a
// new row refused checkpoint_parked). The coordinator's prepare stops at
// that stage: the model (the stage before) is prepared, the resources
// server is never prepared. Gym's collection then aborts with resume: the
// agent and the model reopen, the owner, which never saw the checkpoint,
// answers idempotent and fences the id. A second prepare
// waits for the verify until a resume ends its wait: it answers phase
// idle. The run finishes with its verdict.
func TestPrepareMissesDeadline(t *testing.T) {
	w := newWorld(t, options{})
	r := w.coll.row(1, 0, job{steps: 1, stepS: 0.05})
	r["check"] = `touch verify-started && sleep 12 && [ "$(cat progress)" = "step 1" ]`
	ch := w.coll.start(r)
	testkit.Eventually(t, "the run's verify has started", func() (bool, string) {
		return w.findInSandboxes("verify-started"), "no verify-started marker in any sandbox"
	})
	id := ckID("late")
	prep := w.coord.prepare(id, deadlineIn(1500*time.Millisecond))
	if prep.prepared {
		t.Fatalf("prepare with a run in a wait verify answered prepared: %+v", prep.replies)
	}
	key := episode(r).CaptureKey()
	got := prep.replies[agentEntry]
	if got.Phase != gym.PhasePreparing || got.Report.Ready || !slices.Equal(got.Report.Blockers, []string{key}) || got.Report.BlockerCount != 1 {
		t.Errorf("the agent's prepare reply %+v, want phase preparing, not ready, blockers [%s]", got, key)
	}
	if got := prep.replies[modelEntry]; got.Phase != gym.PhasePrepared {
		t.Errorf("the model's prepare reply %+v, want prepared (its stage comes before the agent's)", got)
	}
	if _, ok := prep.replies[ownerEntry]; ok {
		t.Errorf("the coordinator prepared the resources stage after the agent stage missed its deadline")
	}
	agent := w.coord.member(gym.KindAgent)
	if st := w.coord.status(agent); st.Phase != gym.PhasePreparing || st.Accepting == nil || *st.Accepting {
		t.Errorf("the agent after a late prepare: %+v, want preparing and not accepting", st)
	}
	w.coll.post(t.Context(), w.coll.row(2, 0, job{steps: 1, stepS: 0.05})).refusal(t, gym.CodeCheckpointParked)
	for name, rr := range w.coord.resume(id, deadlineIn(waitLimit)) {
		if want := name == ownerEntry; rr.Idempotent != want {
			t.Errorf("%s: the aborting resume answered idempotent %v, want %v", name, rr.Idempotent, want)
		}
	}
	for _, m := range w.coord.members {
		checkRefusal(t, w.coord.to(m, gym.OpPrepare, plainBody(id, deadlineIn(waitLimit))), gym.CodeStaleCheckpoint)
	}
	// A prepare with time left waits for the verify; a resume meanwhile
	// ends the wait, and the prepare answers the phase the resume left.
	again := ckID("waiting")
	agentM := w.coord.member(gym.KindAgent)
	body, err := json.Marshal(plainBody(again, deadlineIn(waitLimit)))
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan reply, 1)
	go func() {
		r, err := w.coord.post(agentM, gym.OpPrepare, body)
		if err != nil {
			r.body = []byte(err.Error())
		}
		waiting <- r
	}()
	testkit.Eventually(t, "the second prepare waits for the verify", func() (bool, string) {
		st := w.coord.status(agentM)
		return st.Phase == gym.PhasePreparing && deref(st.CheckpointID) == again, fmt.Sprintf("phase %s checkpoint %v", st.Phase, deref(st.CheckpointID))
	})
	w.coord.resume(again, deadlineIn(waitLimit))
	if p := w.coord.checkPrepare(agentM, <-waiting); p.Phase != gym.PhaseIdle {
		t.Errorf("a prepare whose wait a resume ended answered phase %s, want idle", p.Phase)
	}
	checkOneLaunch(t, w, rolloutID(r), await(t, ch).reply(t), 1, 0)
}

// findInSandboxes reports whether a file of this name exists anywhere in
// the test's sandboxes.
func (w *world) findInSandboxes(name string) bool {
	found := false
	filepath.WalkDir(filepath.Join(w.base, "sandboxes"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == name {
			found = true
			return filepath.SkipAll
		}
		return nil
	})
	return found
}
