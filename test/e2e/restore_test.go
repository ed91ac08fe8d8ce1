package e2e

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/ngharness/ngharness/pkg/gym"
)

// TestRestoreRefusedWhileRunsInFlight: a restore asked for while runs are
// in flight (Gym's agent restores only in a process with no live session)
// answers 409 checkpoint_error naming them and installs nothing (it was
// once accepted, and the next /run of a restored rollout failed with a
// 500); the runs go on to their rewards, and the participant stays idle
// with no restored session.
func TestRestoreRefusedWhileRunsInFlight(t *testing.T) {
	const steps = 8
	e := newEnv(t, options{steps: steps})
	a, b := e.rollout("live-a"), e.rollout("live-b")
	cha := e.startRun("/run", a, e.body(a, steps, e.opts.stepS))
	chb := e.startRun("/run", b, e.body(b, steps, e.opts.stepS))
	e.waitStepped(a, b)
	// A checkpoint that holds a record of one of them, as a commit writes it.
	ckID := e.prefix + "-old"
	ckDir := writeRecords(t, filepath.Join(e.dir, "checkpoints", ckID), ckID, seedRecord(a, 0))
	wantRefused(t, e.ctl.call(t, "restore", restoreBody(e.prefix+"-restore", ckDir, episodes(a))), http.StatusConflict, gym.CodeRefused, "in flight", a, b)
	e.wantPhase(t, "idle")
	if s := e.ctl.status(t); s.Report.Counts["sessions"] != 2 {
		t.Errorf("status after the refused restore: %+v, want the 2 live sessions and nothing restored", s)
	}
	for _, ch := range []<-chan runReply{cha, chb} {
		r := await(t, ch)
		if res := r.result(t); res.Reward != 1 || len(res.Launches) != 1 {
			t.Errorf("%s: %+v, want reward 1 from its one launch", r.rollout, res)
		}
	}
	e.wantPhase(t, "idle")
	if s := e.ctl.status(t); s.Report.Counts["sessions"] != 0 {
		t.Errorf("status after the runs: %+v, want no session (nothing restored)", s)
	}
}
