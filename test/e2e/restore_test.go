package e2e

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver"
)

// TestRestoreRefusedWhileRunsInFlight: a restore asked for while runs are
// in flight answers 409 naming them and installs nothing (it was once
// accepted, and the next /run of a restored rollout failed with a 500); the
// runs go on to their rewards, and the participant stays idle.
func TestRestoreRefusedWhileRunsInFlight(t *testing.T) {
	const steps = 8
	e := newEnv(t, options{steps: steps})
	a, b := e.rollout("live-a"), e.rollout("live-b")
	cha := e.startRun("/run", a, e.body(a, steps, e.opts.stepS))
	chb := e.startRun("/run", b, e.body(b, steps, e.opts.stepS))
	e.waitStepped(a, b)
	// A checkpoint that holds a record of one of them.
	ckID := e.prefix + "-old"
	ckDir := filepath.Join(e.dir, "checkpoints", ckID)
	if _, err := driver.WriteRecords(ckDir, driverName, ckID, []driver.Record{{RolloutID: a, Attempt: 1, Bookmark: json.RawMessage(`{"v":1,"next":"seed"}`)}}); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, e.ctl.call(t, "restore", restoreBody(ckID, ckDir, nil)), http.StatusConflict, "in flight", a, b)
	e.wantPhase("idle")
	for _, ch := range []<-chan runReply{cha, chb} {
		r := await(t, ch)
		if res := r.result(t); res.Reward != 1 || len(res.Launches) != 1 {
			t.Errorf("%s: %+v, want reward 1 from its one launch", r.rollout, res)
		}
	}
	e.wantPhase("idle")
}
