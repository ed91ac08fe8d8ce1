package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/pkg/driver/fake"
	"github.com/ngharness/ngharness/pkg/gym"
)

// TestThreeFailedCheckpointsKeepTheLastGoodOne: checkpoint c1 completes
// (the driver's commit and the owner's, into one folder), then three
// checkpoints fail: the driver cannot write its records (a file stands
// where its folder goes) while the owner's commit succeeds, and the
// controller resumes each without publishing it. c1 is the last checkpoint
// that can be restored, and it still can be: after the driver is killed,
// both participants restore it (the owner forks c1's snapshot, which it
// kept though three later exports of the session followed), and the run
// continues from c1's step in the fork to a verified reward 1.
func TestThreeFailedCheckpointsKeepTheLastGoodOne(t *testing.T) {
	const steps = 40
	e := newEnv(t, options{steps: steps, stepS: 0.25})
	id := e.rollout("keep")
	body := e.body(id, steps, e.opts.stepS)
	ch := e.startRun("/run", id, body)
	e.waitStepped(id)

	good := e.prepareCommit(e.prefix + "-c1")
	rec, ok := good.owned[id]
	if !ok || !good.paused[id] {
		t.Fatalf("c1 did not take the run paused: agent records %v, owner records %v", good.records, good.owned)
	}
	done := len(e2eproc.SessionSteps(e.base, id))
	e.resumeAll(good.id)

	for i := 2; i <= 4; i++ {
		cid := fmt.Sprintf("%s-c%d", e.prefix, i)
		dir := filepath.Join(e.dir, "checkpoints", cid)
		if err := os.MkdirAll(filepath.Join(dir, "gym"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "gym", gym.KindAgent), []byte("not a folder"), 0o644); err != nil {
			t.Fatal(err)
		}
		var prep prepared
		e.ctl.must(t, "prepare", plainBody(cid), &prep)
		if prep.Phase != gym.PhasePrepared {
			t.Fatalf("prepare %s: %+v", cid, prep)
		}
		e.prepareOwner(cid)
		wantRefused(t, e.ctl.call(t, "commit", commitBody(cid, dir, nil, false)), http.StatusUnprocessableEntity, gym.CodeCheckpointState)
		if _, owned := e.commitOwner(cid, dir, nil, false); owned[id].EpisodeID != rec.EpisodeID {
			t.Fatalf("the owner's commit of %s did not export the run (did it end too soon?): %v", cid, owned)
		}
		e.resumeAll(cid)
	}
	if _, err := os.Stat(filepath.Join(e.base, "snapshots", rec.State.Snapshot)); err != nil {
		t.Errorf("c1's snapshot after three failed checkpoints: %v", err)
	}

	e.crashDriver()
	if r := await(t, ch); r.err == nil && r.status == http.StatusOK {
		t.Fatalf("the run returned although its driver was killed: %s", r)
	}
	e.startDriver()
	restoreID := e.prefix + "-restore"
	var restored gym.RestoreReply
	e.ctl.must(t, "restore", restoreBody(restoreID, good.dir, episodes(id)), &restored)
	if restored.SourceCheckpointID != good.id || !slices.Equal(restored.Restored, []string{id + "-a1"}) {
		t.Fatalf("the driver's restore of c1 answered %+v", restored)
	}
	e.restoreOwner(restoreID, good.dir, episodes(id), good.id, good.owned)
	again := e.startRun("/run", id, withAttempt(body, 1))
	e.resumeAll(restoreID)
	res := await(t, again).result(t)
	if res.Reward != 1 || len(res.Launches) != 2 {
		t.Fatalf("the restored run: %+v, want reward 1 after two launches", res)
	}
	second := res.Launches[1]
	if reason := fmt.Sprintf("the saved session holds %d completed steps", done); !second.Resumed || second.Reason != reason || second.SandboxID == res.Launches[0].SandboxID {
		t.Errorf("the relaunch %+v, want one resumed in a fork (%q)", second, reason)
	}
	if res.Fake.FirstStep != done+1 || res.Fake.Steps != steps {
		t.Errorf("the restored run's fake_* fields %+v, want steps %d..%d", res.Fake, done+1, steps)
	}
	bm := good.records[id].bookmark(t)
	session := filepath.Join(e.base, "sandboxes", second.SandboxID, hostRel(bm.State.SessionDir, e.base, res.Launches[0].SandboxID))
	if got, err := fake.ReadSteps(session); err != nil || !slices.Equal(got, fake.StepLines(1, steps)) {
		t.Errorf("the fork's session holds %q (%v), want every step once", got, err)
	}
}
