package gym

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
)

var bg = context.Background()

// Ports test_activation_parks_at_its_next_boundary_and_resumes
// (test_checkpoint_agent.py): a prepare waits while a run is between
// boundaries and answers prepared once it parks; resume reopens admission.
func TestPrepareWaitsUntilReadyThenResumeReopens(t *testing.T) {
	f, c := newFake(t, time.Minute)
	f.setBlockers("r")
	done := make(chan *PrepareReply)
	go func() { done <- must(c.Prepare(bg, in("c1", 30))) }()
	testkit.Eventually(t, "admission closed", func() (bool, string) { return !f.isOpen(), "" })
	f.setBlockers()
	got := <-done
	if got.Phase != PhasePrepared || !got.Report.Ready {
		t.Fatalf("prepare = %+v, want prepared and ready", got)
	}
	if f.isOpen() {
		t.Fatal("admission open while prepared")
	}
	r := must(c.Resume(bg, in("c1", 5)))
	if r.Phase != PhaseIdle || r.Idempotent || !f.isOpen() {
		t.Fatalf("resume = %+v open=%v, want idle, not idempotent, admission open", r, f.isOpen())
	}
}

// Ports test_a_wait_step_blocks_prepare_until_its_result_is_recorded
// (test_checkpoint_environment.py) and control.py's "a prepare that misses
// its deadline returns its blockers and leaves admission closed": the
// missed prepare answers 200 preparing with its blockers; a second prepare
// of the same id, once ready, answers prepared.
func TestPrepareThatMissesItsDeadlineKeepsAdmissionClosed(t *testing.T) {
	f, c := newFake(t, time.Minute)
	f.setBlockers("r")
	missed := must(c.Prepare(bg, in("c1", 0.05)))
	if missed.Phase != PhasePreparing || !slices.Equal(missed.Report.Blockers, []string{"r"}) || missed.Report.BlockerCount != 1 {
		t.Fatalf("missed prepare = %+v", missed)
	}
	if f.isOpen() {
		t.Fatal("a missed prepare reopened admission")
	}
	f.setBlockers()
	if got := must(c.Prepare(bg, in("c1", 5))); got.Phase != PhasePrepared {
		t.Fatalf("second prepare = %+v", got)
	}
}

// Ports PrepareReport.cap_blockers: at most 100 listed, all counted; and
// a ready prepare's reply is replayed for the same id
// (test_fence_records_and_replays_results).
func TestPrepareCapsBlockersAndReplaysAReadyReply(t *testing.T) {
	f, c := newFake(t, time.Minute)
	var many []string
	for i := range 150 {
		many = append(many, fmt.Sprintf("r%d", i))
	}
	f.setBlockers(many...)
	missed := must(c.Prepare(bg, in("c1", 0.01)))
	if len(missed.Report.Blockers) != MaxReportedBlockers || missed.Report.BlockerCount != 150 {
		t.Fatalf("blockers listed %d, count %d", len(missed.Report.Blockers), missed.Report.BlockerCount)
	}
	f.setBlockers()
	first := must(c.Prepare(bg, in("c1", 5)))
	f.setBlockers("late") // a replay does not look again
	if again := must(c.Prepare(bg, in("c1", 5))); again != first {
		t.Fatalf("replay = %+v, want the recorded %+v", again, first)
	}
}

// Ports test_fence_rejects_conflicting_checkpoint, test_fence_rejects_invalid_phase
// and test_fence_retires_checkpoint_and_rejects_stale_coordinator
// (test_checkpoint_control.py), as control.py 011c338 fences.
func TestFencing(t *testing.T) {
	f, c := newFake(t, time.Minute)
	_, err := c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: t.TempDir()})
	wantCode(t, err, CodeInvalidPhase) // commit before prepare
	must(c.Prepare(bg, in("c1", 5)))
	_, err = c.Prepare(bg, in("c2", 5))
	wantCode(t, err, CodeConflict)
	_, err = c.Resume(bg, in("c2", 5))
	wantCode(t, err, CodeConflict)
	_, err = c.Restore(bg, &RestoreRequest{Request: in("c1", 5), CheckpointDir: t.TempDir()})
	wantCode(t, err, CodeInvalidPhase)
	must(c.Resume(bg, in("c1", 5)))
	for name, call := range map[string]func() error{
		"prepare": func() error { _, err := c.Prepare(bg, in("c1", 5)); return err },
		"commit": func() error {
			_, err := c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: t.TempDir()})
			return err
		},
		"renew": func() error { _, err := c.Renew(bg, in("c1", 5)); return err },
		"restore": func() error {
			_, err := c.Restore(bg, &RestoreRequest{Request: in("c1", 5), CheckpointDir: t.TempDir()})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) { wantCode(t, call(), CodeStaleCheckpoint) })
	}
	if r := must(c.Resume(bg, in("c1", 5))); !r.Idempotent {
		t.Fatalf("second resume = %+v, want idempotent", r)
	}
	if r := must(c.Prepare(bg, in("c2", 5))); r.Phase != PhasePrepared || f.isOpen() {
		t.Fatalf("a new checkpoint after the resume: %+v", r)
	}
}

// Ports control.py's resume of an idle participant: idempotent, and the id
// is fenced so a delayed prepare cannot close admission; only the last 64
// resumed ids are remembered.
func TestResumeWhenIdleFencesTheIDAndKeeps64(t *testing.T) {
	f, c := newFake(t, time.Minute)
	for i := range ResumedIDsKept + 1 {
		if r := must(c.Resume(bg, in(fmt.Sprintf("c%d", i), 5))); !r.Idempotent || r.Phase != PhaseIdle {
			t.Fatalf("resume when idle = %+v", r)
		}
	}
	_, err := c.Prepare(bg, in("c1", 5))
	wantCode(t, err, CodeStaleCheckpoint)
	if !f.isOpen() {
		t.Fatal("a fenced prepare closed admission")
	}
	// c0 is the 65th most recent: forgotten, so it is a fresh id again.
	if r := must(c.Prepare(bg, in("c0", 5))); r.Phase != PhasePrepared {
		t.Fatalf("prepare of a forgotten id = %+v", r)
	}
}

// Ports test_fence_failure_restores_entry_phase_and_allows_retry and
// control.py's "a prepare that raises reopens admission".
func TestPrepareWhoseCloseFailsReopens(t *testing.T) {
	f, c := newFake(t, time.Minute)
	f.closeErr = Refuse(ErrRefused, "close failed part way")
	_, err := c.Prepare(bg, in("c1", 5))
	wantCode(t, err, CodeRefused)
	if s := c.Status(); s.Phase != PhaseIdle || s.CheckpointID != nil || !f.isOpen() {
		t.Fatalf("after a failed close: %+v open=%v", s, f.isOpen())
	}
	if r := must(c.Prepare(bg, in("c1", 5))); r.Phase != PhasePrepared {
		t.Fatalf("retry = %+v", r)
	}
}

// A resume while a prepare waits ends the wait: the prepare answers the
// phase it finds (control.py _prepare, "a resume ... finished this
// checkpoint while we waited").
func TestResumeWhilePrepareWaits(t *testing.T) {
	f, c := newFake(t, time.Minute)
	f.setBlockers("r")
	done := make(chan *PrepareReply)
	go func() { done <- must(c.Prepare(bg, in("c1", 30))) }()
	testkit.Eventually(t, "admission closed", func() (bool, string) { return !f.isOpen(), "" })
	must(c.Resume(bg, in("c1", 5)))
	if got := <-done; got.Phase != PhaseIdle {
		t.Fatalf("prepare ended by resume = %+v, want idle", got)
	}
}

// The lease: every call moves it to max(current, deadline_ts + grace);
// renew answers it; when it passes, the participant resumes on its own,
// and the id is then stale. Renew when idle is an invalid phase.
func TestLeaseRenewAndExpiry(t *testing.T) {
	_, c := newFake(t, time.Minute)
	_, err := c.Renew(bg, in("c1", 5))
	wantCode(t, err, CodeInvalidPhase)
	first := in("c1", 5)
	must(c.Prepare(bg, first))
	if s := c.Status(); *s.LeaseExpiresAt != first.DeadlineTS+60 {
		t.Fatalf("lease after prepare = %v, want deadline + grace", *s.LeaseExpiresAt)
	}
	far := in("c1", 120)
	if r := must(c.Renew(bg, far)); r.LeaseExpiresAt != far.DeadlineTS+60 {
		t.Fatalf("renew = %v, want %v", r.LeaseExpiresAt, far.DeadlineTS+60)
	}
	if r := must(c.Renew(bg, first)); r.LeaseExpiresAt != far.DeadlineTS+60 {
		t.Fatalf("an earlier deadline moved the lease back: %v", r.LeaseExpiresAt)
	}

	f2, c2 := newFake(t, 0)
	f2.setBlockers("r")
	must(c2.Prepare(bg, in("c1", 0.05)))
	testkit.Eventually(t, "lease expiry resumes", func() (bool, string) { return c2.Status().Phase == PhaseIdle && f2.isOpen(), "" })
	_, err = c2.Prepare(bg, in("c1", 5))
	wantCode(t, err, CodeStaleCheckpoint)
	if s := c2.Status(); s.LeaseExpiresAt != nil {
		t.Fatalf("lease kept after expiry: %v", *s.LeaseExpiresAt)
	}
}

// Ports test_commit_restore_round_trip_and_retire_after_restore and
// test_restore_installs_sessions_under_the_next_attempt: commit writes the
// records manifest last and replays its reply; a fresh participant
// restores only the scope, under attempt + 1.
func TestCommitThenRestoreUnderTheNextAttempt(t *testing.T) {
	dir := t.TempDir()
	f, c := newFake(t, time.Minute)
	f.records = []Record{rec(t, "r", 1, 4), rec(t, "s", 0, 2), rec(t, "r", 1, 4)}
	must(c.Prepare(bg, in("c1", 5)))
	reply := must(c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: dir}))
	if reply.Phase != PhaseCommitted || !slices.Equal(reply.EpisodeIDs, []string{"r-a1", "s"}) || reply.Manifest.RecordCount != 3 {
		t.Fatalf("commit = %+v", reply)
	}
	if again := must(c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: "/elsewhere"})); again != reply {
		t.Fatal("a retried commit was not replayed")
	}
	if f.exports != 1 {
		t.Fatalf("exported %d times", f.exports)
	}
	must(c.Resume(bg, in("c1", 5)))

	g, d := newFake(t, time.Minute)
	scope := []EpisodeID{{"r", 1}}
	restored := must(d.Restore(bg, &RestoreRequest{Request: in("r1", 5), CheckpointDir: dir, EpisodeIDs: scope}))
	want := &RestoreReply{Phase: PhaseRestored, SourceCheckpointID: "c1", Restored: []string{"r-a2", "r-a2"}}
	if fmt.Sprint(restored) != fmt.Sprint(want) {
		t.Fatalf("restore = %+v, want %+v", restored, want)
	}
	if len(g.installed) != 2 || g.installed[0].EpisodeID != (EpisodeID{"r", 1}) || !slices.Equal(g.scopes[0], scope) {
		t.Fatalf("installed %v with scope %v", g.installed, g.scopes)
	}
	if g.isOpen() {
		t.Fatal("admission open after restore, before resume")
	}
	if again := must(d.Restore(bg, &RestoreRequest{Request: in("r1", 5), CheckpointDir: dir, EpisodeIDs: scope})); again != restored {
		t.Fatal("a retried restore was not replayed")
	}
	if s := d.Status(); s.Phase != PhaseRestored || *s.CheckpointID != "r1" {
		t.Fatalf("status after restore = %+v", s)
	}
	must(d.Resume(bg, in("r1", 5)))
	if !g.isOpen() {
		t.Fatal("admission closed after resume")
	}
}

// Commit re-checks readiness (control.py: readiness can regress after an
// out-of-order prepare) and refuses a scope that names a restart; an empty
// scope commits nothing (test_an_agent_without_session_hooks_reports_its_
// rollouts_as_restarts_that_keep_running).
func TestCommitRefusesRegressionAndRestartsInScope(t *testing.T) {
	f, c := newFake(t, time.Minute)
	f.restarts = []string{"r"}
	prepared := must(c.Prepare(bg, in("c1", 5)))
	if !slices.Equal(prepared.Report.Restarts, []string{"r"}) || len(prepared.Report.Blockers) != 0 {
		t.Fatalf("prepare report = %+v", prepared.Report)
	}
	_, err := c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: t.TempDir(), EpisodeIDs: []EpisodeID{{"r", 0}}})
	wantCode(t, err, CodeRestartInScope)
	reply := must(c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: t.TempDir(), EpisodeIDs: []EpisodeID{}}))
	if len(reply.EpisodeIDs) != 0 || reply.Manifest.RecordCount != 0 {
		t.Fatalf("empty scope commit = %+v", reply)
	}
	must(c.Resume(bg, in("c1", 5)))

	f.restarts = nil
	must(c.Prepare(bg, in("c2", 5)))
	f.setBlockers("r")
	_, err = c.Commit(bg, &CommitRequest{Request: in("c2", 5), CheckpointDir: t.TempDir()})
	wantCode(t, err, CodeInvalidPhase)
}

// With stop, the exported state is parked once the write is durable: the
// manifest is on disk when ParkExported runs.
func TestCommitWithStopParksAfterTheWrite(t *testing.T) {
	dir := t.TempDir()
	f, c := newFake(t, time.Minute)
	f.records = []Record{rec(t, "r", 0, 1)}
	f.manifest = func() bool {
		_, err := os.Stat(filepath.Join(dir, "gym", "agent", "inst", ManifestName))
		return err == nil
	}
	must(c.Prepare(bg, in("c1", 5)))
	must(c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: dir, Stop: true}))
	if len(f.parked) != 1 || !slices.Equal(f.parkedAt, []bool{true}) {
		t.Fatalf("parked %v (manifest there: %v)", f.parked, f.parkedAt)
	}
	g, d := newFake(t, time.Minute)
	g.records = f.records
	must(d.Prepare(bg, in("c1", 5)))
	must(d.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: t.TempDir()}))
	if len(g.parked) != 0 {
		t.Fatal("parked without stop")
	}
}

// holdWrites holds every write just before it publishes until release is
// called (the sequences test's GatedWrites with hold_publishing unset).
func holdWrites(t *testing.T) (release func()) {
	gate := make(chan struct{})
	hold := func() error { <-gate; return nil }
	beforePublish.Store(&hold)
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(func() { release(); beforePublish.Store(nil) })
	return release
}

// Ports the sequences test's "what a checkpoint stores is its first export,
// even when a commit is retried": a write that outlives the deadline fails
// the commit with deadline_exceeded and goes on; a retry waits for the
// same write and exports nothing again; a retry to another folder is a
// conflict.
func TestCommitWriteOutlivesItsDeadline(t *testing.T) {
	dir := t.TempDir()
	f, c := newFake(t, time.Minute)
	f.records = []Record{rec(t, "r", 0, 1)}
	release := holdWrites(t)
	must(c.Prepare(bg, in("c1", 5)))
	_, err := c.Commit(bg, &CommitRequest{Request: in("c1", 0.5), CheckpointDir: dir})
	wantCode(t, err, CodeDeadlineExceeded)
	_, err = c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: t.TempDir()})
	wantCode(t, err, CodeConflict)
	go func() { time.Sleep(20 * time.Millisecond); release() }()
	reply := must(c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: dir}))
	if reply.Manifest.RecordCount != 1 || f.exports != 1 {
		t.Fatalf("retried commit = %+v after %d exports", reply, f.exports)
	}
}

// Ports the sequences test's "once resume returns, no manifest appears for
// a checkpoint that had none, even if a write was publishing".
func TestResumeStopsAWriteBeforeItPublishes(t *testing.T) {
	dir := t.TempDir()
	f, c := newFake(t, time.Minute)
	f.records = []Record{rec(t, "r", 0, 1)}
	release := holdWrites(t)
	must(c.Prepare(bg, in("c1", 5)))
	_, err := c.Commit(bg, &CommitRequest{Request: in("c1", 0.5), CheckpointDir: dir})
	wantCode(t, err, CodeDeadlineExceeded)
	must(c.Resume(bg, in("c1", 5)))
	release()
	pdir := filepath.Join(dir, "gym", "agent", "inst")
	testkit.Eventually(t, "the stopped write cleans up", func() (bool, string) {
		entries, _ := os.ReadDir(pdir)
		return len(entries) == 0, ""
	})
	if _, err := os.Stat(filepath.Join(pdir, ManifestName)); !os.IsNotExist(err) {
		t.Fatalf("a manifest appeared after resume: %v", err)
	}
}

// Ports test_a_commit_that_no_longer_continues_a_restored_session_retires_it
// (and its environment twin): restored state the scope leaves out is
// deleted, without a lasting refusal of its attempt.
func TestCommitDeletesRestoredStateOutsideItsScope(t *testing.T) {
	src := t.TempDir()
	f, c := newFake(t, time.Minute)
	f.records = []Record{rec(t, "k", 0, 1), rec(t, "d", 0, 1)}
	must(c.Prepare(bg, in("c1", 5)))
	must(c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: src}))

	g, d := newFake(t, time.Minute)
	must(d.Restore(bg, &RestoreRequest{Request: in("r1", 5), CheckpointDir: src, EpisodeIDs: []EpisodeID{{"k", 0}, {"d", 0}}}))
	must(d.Resume(bg, in("r1", 5)))
	must(d.Prepare(bg, in("c2", 5)))
	must(d.Commit(bg, &CommitRequest{Request: in("c2", 5), CheckpointDir: t.TempDir(), EpisodeIDs: []EpisodeID{{"k", 1}}}))
	if !slices.Equal(g.deleted, []EpisodeID{{"d", 1}}) {
		t.Fatalf("deleted %v, want only d-a1", g.deleted)
	}
	if err := d.CheckAttempt(EpisodeID{"d", 1}); err != nil {
		t.Fatalf("a deleted restored attempt is refused: %v", err)
	}
}

// Ports test_retire_stops_the_activation_before_it_replies and
// RetiredAttempts: retire refuses the attempt and every earlier one until
// forget, calls the participant's Retire before replying, and is refused
// while a checkpoint is open; the marks stay when the retire fails
// (test_a_retire_cut_short_keeps_the_session_until_its_activation_stops).
func TestRetireAndForget(t *testing.T) {
	f, c := newFake(t, time.Minute)
	must(c.Prepare(bg, in("c1", 5)))
	_, err := c.Retire(bg, &RetireRequest{Request: in("retire", 5), EpisodeIDs: []EpisodeID{{"r", 1}}})
	wantCode(t, err, CodeInvalidPhase)
	must(c.Resume(bg, in("c1", 5)))

	reply := must(c.Retire(bg, &RetireRequest{Request: in("retire", 5), EpisodeIDs: []EpisodeID{{"r", 1}, {"q", 0}}}))
	if !slices.Equal(reply.Retired, []string{"r-a1", "q"}) || !slices.Equal(f.retired, []EpisodeID{{"r", 1}, {"q", 0}}) {
		t.Fatalf("retire = %+v, participant retired %v", reply, f.retired)
	}
	for _, id := range []EpisodeID{{"r", 0}, {"r", 1}, {"q", 0}} {
		wantCode(t, c.CheckAttempt(id), CodeStaleAttempt)
	}
	if err := c.CheckAttempt(EpisodeID{"r", 2}); err != nil {
		t.Fatalf("a later attempt is refused: %v", err)
	}
	// A lower retire never lowers the mark.
	must(c.Retire(bg, &RetireRequest{Request: in("retire", 5), EpisodeIDs: []EpisodeID{{"r", 0}}}))
	wantCode(t, c.CheckAttempt(EpisodeID{"r", 1}), CodeStaleAttempt)
	if s := c.Status(); s.RetiredRollouts != 2 {
		t.Fatalf("retired_rollouts = %d", s.RetiredRollouts)
	}
	if r := must(c.Forget(bg, &ForgetRequest{Request: in("forget", 5), RolloutIDs: []string{"r", "q"}})); !slices.Equal(r.Forgotten, []string{"q", "r"}) {
		t.Fatalf("forget = %+v", r)
	}
	if err := c.CheckAttempt(EpisodeID{"r", 0}); err != nil {
		t.Fatalf("forgotten rollout still refused: %v", err)
	}

	f.retireErr = Refuse(ErrDeadlineExceeded, "still stopping")
	_, err = c.Retire(bg, &RetireRequest{Request: in("retire", 5), EpisodeIDs: []EpisodeID{{"x", 0}}})
	wantCode(t, err, CodeDeadlineExceeded)
	wantCode(t, c.CheckAttempt(EpisodeID{"x", 0}), CodeStaleAttempt)
	_, err = c.Retire(bg, &RetireRequest{Request: in("retire", -1), EpisodeIDs: []EpisodeID{{"y", 0}}})
	wantCode(t, err, CodeDeadlineExceeded)
	if err := c.CheckAttempt(EpisodeID{"y", 0}); err != nil {
		t.Fatal("a retire past its deadline still marked the attempt")
	}
}

// After a restore, retire is allowed under the restore's own id and
// conflicts under another (control.py _admit_outside_checkpoint).
func TestRetireAfterRestore(t *testing.T) {
	src := t.TempDir()
	f, c := newFake(t, time.Minute)
	f.records = []Record{rec(t, "r", 0, 1)}
	must(c.Prepare(bg, in("c1", 5)))
	must(c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: src}))
	g, d := newFake(t, time.Minute)
	must(d.Restore(bg, &RestoreRequest{Request: in("r1", 5), CheckpointDir: src, EpisodeIDs: []EpisodeID{{"r", 0}}}))
	_, err := d.Retire(bg, &RetireRequest{Request: in("cleanup", 5), EpisodeIDs: []EpisodeID{{"r", 1}}})
	wantCode(t, err, CodeConflict)
	must(d.Retire(bg, &RetireRequest{Request: in("r1", 5), EpisodeIDs: []EpisodeID{{"r", 1}}}))
	if !slices.Equal(g.retired, []EpisodeID{{"r", 1}}) {
		t.Fatalf("retired %v", g.retired)
	}
}

// A restore whose install fails reopens admission and stays idle; one
// whose install outlives the deadline reopens only once the install ends;
// a missing or foreign folder is invalid_checkpoint_state.
func TestRestoreFailures(t *testing.T) {
	src := t.TempDir()
	f, c := newFake(t, time.Minute)
	f.records = []Record{rec(t, "r", 0, 1)}
	must(c.Prepare(bg, in("c1", 5)))
	must(c.Commit(bg, &CommitRequest{Request: in("c1", 5), CheckpointDir: src}))
	scope := []EpisodeID{{"r", 0}}

	_, d := newFake(t, time.Minute)
	_, err := d.Restore(bg, &RestoreRequest{Request: in("r1", 5), CheckpointDir: t.TempDir(), EpisodeIDs: scope})
	wantCode(t, err, CodeCheckpointState)

	g, e := newFake(t, time.Minute)
	g.install = func(context.Context) error { return Refuse(ErrCheckpointState, "record of r is invalid") }
	_, err = e.Restore(bg, &RestoreRequest{Request: in("r1", 5), CheckpointDir: src, EpisodeIDs: scope})
	wantCode(t, err, CodeCheckpointState)
	if s := e.Status(); s.Phase != PhaseIdle || !g.isOpen() {
		t.Fatalf("after a failed install: phase %s open %v", s.Phase, g.isOpen())
	}

	h, k := newFake(t, time.Minute)
	slow := make(chan struct{})
	h.install = func(context.Context) error { <-slow; return nil }
	// The read and the close finish well inside the second; the install does not.
	_, err = k.Restore(bg, &RestoreRequest{Request: in("r1", 1), CheckpointDir: src, EpisodeIDs: scope})
	wantCode(t, err, CodeDeadlineExceeded)
	if h.isOpen() {
		t.Fatal("admission reopened while the install still runs")
	}
	close(slow)
	testkit.Eventually(t, "admission reopens after the install", func() (bool, string) { return h.isOpen(), "" })
}

// Status carries Gym's fields, nulls when idle, and the participant's
// extras at the top level.
func TestStatusReply(t *testing.T) {
	f, c := newFake(t, time.Minute)
	var idle map[string]any
	if err := json.Unmarshal(must(json.Marshal(c.Status())), &idle); err != nil {
		t.Fatal(err)
	}
	want := `map[accepting:true checkpoint_id:<nil> instance:inst kind:agent lease_expires_at:<nil> phase:idle report:map[blocker_count:0 blockers:[] counts:map[sessions:0] ready:true restarts:[]] retired_rollouts:0]`
	if fmt.Sprint(idle) != want {
		t.Fatalf("idle status = %v\nwant %v", idle, want)
	}
	req := in("c1", 5)
	must(c.Prepare(bg, req))
	s := c.Status()
	if *s.CheckpointID != "c1" || *s.LeaseExpiresAt != req.DeadlineTS+60 || s.Phase != PhasePrepared || s.Extra["accepting"] != false {
		t.Fatalf("status while prepared = %+v", s)
	}
	_ = f
}
