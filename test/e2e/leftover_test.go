package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/e2eproc"
	"github.com/ngharness/ngharness/pkg/gym"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestRestartedOwnerEndsADeadDeploymentsLaunches: two runs are paused at a
// committed checkpoint when both servers are killed with SIGKILL, and the
// checkpoint is torn (each participant's records file cut short), so the
// restore that follows is refused by both fresh servers, as it must be.
// Nothing continues those runs, yet their launches were left paused, each
// holding its mount namespace, forever. The fresh owner on the same base
// ends them before it serves: every process the harnesses recorded
// (harness, child, own session, double-forked daemon, the child that
// cleared its environment, so no tag names it) and every supervisor is gone
// once it listens. A second deployment on the same host, with a base of
// its own and a run in flight, loses nothing: all its processes live on
// and its run finishes every step once.
func TestRestartedOwnerEndsADeadDeploymentsLaunches(t *testing.T) {
	const steps = 12
	e := newEnv(t, options{steps: steps})
	other := newEnv(t, options{steps: steps})
	var ids []string
	chans := map[string]<-chan runReply{}
	for i := range 2 {
		id := e.rollout(fmt.Sprintf("dead%d", i))
		ids = append(ids, id)
		chans[id] = e.startRun("/run", id, e.body(id, steps, e.opts.stepS))
	}
	live := other.rollout("live")
	liveCh := other.startRun("/run", live, other.body(live, steps, other.opts.stepS))
	e.waitStepped(ids...)
	other.waitStepped(live)
	ck := e.prepareCommit(e.prefix + "-ck1")
	dead := append(e2eproc.RecordedLeftovers(e.base, e.since), supervisors(t, e.base)...)
	kept := append(e2eproc.RecordedLeftovers(other.base, other.since), supervisors(t, other.base)...)
	if len(dead) < 2*6 || len(kept) < 6 {
		t.Fatalf("fixture: %d processes of the paused runs, %d of the other deployment's run; want 6 a run at least", len(dead), len(kept))
	}
	e.crashAll()
	for _, id := range ids {
		if r := await(t, chans[id]); r.err == nil && r.status == http.StatusOK {
			t.Fatalf("run %s returned although its servers were killed: %s", id, r)
		}
	}
	for _, p := range dead {
		if !p.Alive() {
			t.Fatalf("fixture: %s ended with the servers", p)
		}
	}
	tear(t, ck.dir)

	e.restartOwner()
	e.startDriver()
	for _, p := range dead {
		if p.Alive() {
			t.Errorf("the restarted owner serves while a process of the dead deployment lives: %s", p)
		}
	}
	restoreID := e.prefix + "-restore1"
	for _, c := range []*controller{e.ctl, e.own} {
		wantRefused(t, c.call(t, "restore", restoreBody(restoreID, ck.dir, episodes(ids...))), http.StatusUnprocessableEntity, gym.CodeCheckpointState)
	}
	for _, p := range kept {
		if !p.Alive() {
			t.Errorf("a process of the other deployment was ended: %s", p)
		}
	}
	res := await(t, liveCh).result(t)
	checkOneLaunch(t, other, live, res, steps, 0)
	if !strings.Contains(e.owner.Errs.String(), "ended what a deployment that died left running") {
		t.Errorf("the restarted owner did not say what it ended:\n%s", e2eproc.Tail(e.owner.Errs.String(), 3000))
	}
}

// supervisors lists the live supervisors the receipts of the launch folders
// under base name (by pid and start time).
func supervisors(t *testing.T, base string) []e2eproc.Info {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(base, "sandboxes", "*", ".ngharness", "launches", "*"))
	var out []e2eproc.Info
	for _, d := range dirs {
		r, err := proto.ReadReceipt(d)
		if err != nil {
			t.Fatalf("the receipt in %s: %v", d, err)
		}
		if p, ok := e2eproc.ReadProc(r.SupervisorPID); ok && p.Start == r.SupervisorStartTicks && p.Alive() {
			out = append(out, p)
		}
	}
	return out
}

// tear cuts the records file of every participant of the checkpoint in
// dir short, as a write the crash interrupted would leave it: the
// manifest's digest no longer matches.
func tear(t *testing.T, dir string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "gym", "*", "*", "records-*.jsonl"))
	if len(files) != 2 {
		t.Fatalf("the checkpoint in %s has records files %q, want the driver's and the owner's", dir, files)
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCrashBothRestoredLeavesNothingOfTheOldAttempt: two runs paused at a
// committed checkpoint, both servers killed with SIGKILL, fresh servers on
// the same config restored from it, and the runs continued as attempt 1 in
// forks of their snapshots, each to reward 1 with no step repeated. Then
// nothing of attempt 0 runs any more (every process its harnesses recorded,
// and its supervisors), and no server warned: the forks carry attempt 0's
// launch folders, whose stop at the end of each session once warned
// "the stop could not make sure the launch is gone ... partial=true" after
// scanning every process on the host for their tags.
func TestCrashBothRestoredLeavesNothingOfTheOldAttempt(t *testing.T) {
	const steps = 12
	e := newEnv(t, options{steps: steps})
	var ids []string
	chans := map[string]<-chan runReply{}
	bodies := map[string]map[string]any{}
	for i := range 2 {
		id := e.rollout(fmt.Sprintf("p%d", i))
		ids = append(ids, id)
		bodies[id] = e.body(id, steps, e.opts.stepS)
		chans[id] = e.startRun("/run", id, bodies[id])
	}
	e.waitStepped(ids...)
	ck := e.prepareCommit(e.prefix + "-ck1")
	at := map[string]int{}
	for _, id := range ids {
		at[id] = len(e2eproc.SessionSteps(e.base, id))
	}
	old := append(e2eproc.RecordedLeftovers(e.base, e.since), supervisors(t, e.base)...)
	e.crashAll()
	for _, id := range ids {
		await(t, chans[id])
	}
	e.restartOwner()
	e.startDriver()
	restoreID := e.prefix + "-restore1"
	e.ctl.must(t, "restore", restoreBody(restoreID, ck.dir, episodes(ids...)), nil)
	e.restoreOwner(restoreID, ck.dir, episodes(ids...), ck.id, ck.owned)
	e.resumeAll(restoreID)
	again := map[string]<-chan runReply{}
	for _, id := range ids {
		again[id] = e.startRun("/run", id, withAttempt(bodies[id], 1))
	}
	for _, id := range ids {
		checkContinued(t, e, id, await(t, again[id]).result(t), steps, at[id], ck.records[id].bookmark(t))
	}
	for _, p := range old {
		if p.Alive() {
			t.Errorf("a process of attempt 0 still runs: %s", p)
		}
	}
	e.mu.Lock()
	servers := append(append([]*e2eproc.Proc{}, e.drivers...), e.owners...)
	e.mu.Unlock()
	for _, p := range servers {
		for _, line := range strings.Split(p.Errs.String(), "\n") {
			if strings.Contains(line, `"level":"WARN"`) {
				t.Errorf("%s warned: %s", p.Name, line)
			}
		}
	}
}
