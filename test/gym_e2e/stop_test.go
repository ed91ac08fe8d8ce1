package gyme2e

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"

	"github.com/ngharness/ngharness/pkg/gym"
)

// TestCommitStop: a checkpoint asked for by a preemption signal
// (collection.py checkpoint(stop=True)): commit with stop: true, then the
// controller stops instead of resuming. Once the write is durable the
// participants free what the exported state holds outside the processes:
// by the time the commit replied, every process of the paused launches is
// gone and the owner has removed the exported sandboxes. The servers then
// go down with the job (SIGKILL); a rerun restores the checkpoint into
// fresh processes and every row continues from its bookmark in a fork of
// its snapshot: nothing lost, no step twice.
func TestCommitStop(t *testing.T) {
	const steps = 10
	w := newWorld(t, options{steps: steps})
	var rows []row
	chans := map[string]<-chan runResult{}
	for i := 1; i <= 3; i++ {
		r := w.coll.row(i, 0, job{steps: steps, stepS: 0.3})
		rows = append(rows, r)
		chans[rolloutID(r)] = w.coll.start(r)
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, rolloutID(r))
	}
	w.waitSteps(3, ids...)

	id := ckID("stop")
	deadline := deadlineIn(waitLimit)
	prep := w.coord.prepare(id, deadline)
	if !prep.prepared {
		t.Fatalf("prepare: %+v", prep.replies)
	}
	atSnapshot := map[string]int{}
	var live []e2eproc.Info
	sandboxes := map[string]bool{}
	for _, r := range ids {
		atSnapshot[r] = len(e2eproc.SessionSteps(w.base, r))
		live = append(live, w.harnessProcs(r)...)
		for _, f := range w.sessionSandboxes(r) {
			sandboxes[f] = true
		}
	}
	if len(live) == 0 || len(sandboxes) != len(rows) {
		t.Fatalf("before the commit: %d live harness processes, sandboxes %v; want some, and one sandbox per row", len(live), sandboxes)
	}
	scope := prep.continued(episodes(rows...))
	commits := w.coord.commit(id, w.checkpointDir(id), scope, true, deadline)
	for _, m := range w.coord.members {
		checkStore(t, w.checkpointDir(id), m, commits[m.Name])
	}
	if left := stillRunning(live); len(left) > 0 {
		t.Errorf("commit with stop replied while processes of the exported launches still run: %v", left)
	}
	for sb := range sandboxes {
		if _, err := os.Stat(filepath.Join(w.base, "sandboxes", sb)); err == nil {
			t.Errorf("commit with stop left the exported sandbox %s in place", sb)
		}
	}

	w.crash()
	for _, r := range ids {
		if res := await(t, chans[r]); res.err == nil && res.status == http.StatusOK {
			t.Fatalf("%s returned although its servers stopped", res)
		}
	}
	w.startServers()
	rid := restoreID()
	deadline = deadlineIn(waitLimit)
	for name, rr := range w.coord.restore(rid, w.checkpointDir(id), scope, deadline) {
		if want := len(restoredBy(name, keysOf(scope)...)); len(rr.Restored) != want {
			t.Errorf("%s restored %q, want %d episodes", name, rr.Restored, want)
		}
	}
	w.coord.resume(rid, deadline)
	again := map[string]<-chan runResult{}
	for _, r := range rows {
		again[rolloutID(r)] = w.coll.start(nextAttempt(r))
	}
	for _, r := range ids {
		checkContinued(t, w, r, await(t, again[r]).reply(t), steps, atSnapshot[r], false)
	}
	if got := keysOf(scope); !slices.Equal(got, keysOf(episodes(rows...))) {
		t.Errorf("the stop checkpoint's scope %q, want every row", got)
	}
	for _, m := range w.coord.members {
		if st := w.coord.status(m); st.Phase != gym.PhaseIdle {
			t.Errorf("%s at the end: phase %s", m.Name, st.Phase)
		}
	}
}

// sessionSandboxes lists the ids of the sandboxes that hold a session of
// the rollout.
func (w *world) sessionSandboxes(rollout string) []string {
	root := filepath.Join(w.base, "sandboxes")
	dirs, _ := filepath.Glob(filepath.Join(root, "*", ".ngharness", "state", "fake", rollout+"-a*"))
	var out []string
	for _, d := range dirs {
		rel, _ := filepath.Rel(root, d)
		out = append(out, strings.SplitN(rel, string(filepath.Separator), 2)[0])
	}
	return out
}
