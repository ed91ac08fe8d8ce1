package driver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/gym"
)

// The cases of Gym's own tests of its agent participant and of its
// episode steps (tests/unit_tests/test_checkpoint_agent.py at 00675de, the
// control-plane and environment tests of the same series, read against
// control.py at 011c338 and steps.py at 05bf55a) that apply to legacy /run
// episodes, run here on real runs of the fake adapter. Each test names the
// Gym test it ports.

// reqAt is a control request whose deadline is d from now.
func reqAt(id string, d time.Duration) gym.Request {
	return gym.Request{CheckpointID: id, DeadlineTS: float64(time.Now().Add(d).UnixNano()) / 1e9}
}

// holdPause holds the first `ngsup pause` the driver runs until release is
// called (or the exec's context ends): the run asked to park stays in its
// harness step, between bookmarks. entered is closed once the pause is
// held. The test's cleanup releases it.
func holdPause(t *testing.T, e *drivertest.Env) (entered <-chan struct{}, release func()) {
	t.Helper()
	in, out := make(chan struct{}), make(chan struct{})
	var once, first sync.Once
	release = func() { once.Do(func() { close(out) }) }
	t.Cleanup(release)
	e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
		if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "pause" {
			held := false
			first.Do(func() { held = true })
			if held {
				close(in)
				select {
				case <-out:
				case <-ctx.Done():
					return execRes{ExitCode: -1}, ctx.Err()
				}
			}
		}
		return next(ctx, req)
	})
	return in, release
}

// inHarness starts rollout name (attempt) on rn and waits until its harness
// has done a step; it returns the rollout id, the run, its sandbox and the
// host folder of its fake session.
func inHarness(t *testing.T, e *drivertest.Env, rn *driver.Runner, name string, attempt int, extra map[string]any) (string, *drivertest.Handle, string, string) {
	t.Helper()
	ro := e.Rollout(name)
	run := e.StartRunning(rn, ro, attempt, drivertest.Task(ro, steps, stepS, extra), drivertest.Until{Steps: 1})
	return ro, run.Handle, run.SandboxID, run.Session
}

// key is the capture key of rollout's attempt.
func key(rollout string, attempt int) string {
	return gym.EpisodeID{RolloutID: rollout, Attempt: attempt}.CaptureKey()
}

// checkCode fails unless err is kind and goes on the wire as status/code.
func checkCode(t *testing.T, what string, err, kind error, code string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Errorf("%s: %v, want %v", what, err, kind)
		return
	}
	if status, got := gym.Classify(err); got != code || status != 409 {
		t.Errorf("%s: answered %d %s, want 409 %s", what, status, got, code)
	}
}

// readBack reads the records committed for id into dir, as raw JSON by
// capture key.
func readBack(t *testing.T, dir string) map[string]map[string]json.RawMessage {
	t.Helper()
	out := map[string]map[string]json.RawMessage{}
	if _, err := gym.ReadState(dir, gym.KindAgent, driver.DefaultInstance, func(r gym.Record) error {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(r.JSON, &m); err != nil {
			return err
		}
		out[r.EpisodeID.CaptureKey()] = m
		return nil
	}); err != nil {
		t.Fatalf("read back the checkpoint in %s: %v", dir, err)
	}
	return out
}

// sameReport compares two reports as they go on the wire.
func sameReport(a, b gym.Report) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// commitDriver commits the participant's records for id (the owner's
// sessions are not snapshotted: a verify in flight holds its session) and
// reads them back from disk.
func commitDriver(t *testing.T, e *drivertest.Env, p *driver.Participant, id string) []record {
	t.Helper()
	dir := e.CheckpointDir(id)
	if _, err := p.Control().Commit(context.Background(), &gym.CommitRequest{Request: request(id), CheckpointDir: dir}); err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	var recs []gym.Record
	if _, err := gym.ReadState(dir, gym.KindAgent, driver.DefaultInstance, func(r gym.Record) error {
		recs = append(recs, r)
		return nil
	}); err != nil {
		t.Fatalf("read back checkpoint %s: %v", id, err)
	}
	return toRecords(t, recs)
}

// accepting is the participant's "accepting" status field.
func accepting(p *driver.Participant) any { return p.Control().Status().Extra["accepting"] }

// TestGymPrepareNotReadyWhileRunInHarness ports Gym's
// test_legacy_run_steps_block_prepare_only_when_waited_on (agent) and
// test_prepare_that_misses_deadline_stays_closed_until_straggler_is_retired
// (control plane): a run whose harness step is under way (its pause is
// held, so it cannot park) blocks a prepare; the prepare that misses its
// deadline answers phase preparing with the run's capture key as the only
// blocker (blocker_count 1, counts sessions 1 and at_boundary 0) and leaves
// admission closed (accepting false, a new rollout refused). Once the pause
// lands and the run parks, the same prepare is ready (at_boundary 1), and
// after the resume the run finishes, paused once, verified.
func TestGymPrepareNotReadyWhileRunInHarness(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	pausing, release := holdPause(t, e)
	ro, h, _, _ := inHarness(t, e, rn, "blocker", 1, nil)

	missed, err := c.Prepare(ctx, reqAt("ckpt-1", 300*time.Millisecond))
	if err != nil {
		t.Fatalf("the prepare that misses its deadline: %v", err)
	}
	want := gym.NewReport(false, []string{key(ro, 1)}, map[string]int{"sessions": 1, "at_boundary": 0}, nil)
	if missed.Phase != gym.PhasePreparing || !sameReport(missed.Report, want) {
		t.Errorf("the missed prepare answered %s %+v, want preparing %+v", missed.Phase, missed.Report, want)
	}
	if st := c.Status(); st.Phase != gym.PhasePreparing || st.Extra["accepting"] != false {
		t.Errorf("after the missed prepare: phase %s accepting %v, want preparing and closed", st.Phase, st.Extra["accepting"])
	}
	late := e.Rollout("late")
	_, err = rn.Run(ctx, driver.RunRequest{RolloutID: late, Body: drivertest.Task(late, 3, 0.1, nil)})
	checkCode(t, "a new rollout after the missed prepare", err, gym.ErrCheckpointParked, gym.CodeCheckpointParked)

	await(t, pausing, "the pause", h)
	release()
	ready, err := c.Prepare(ctx, request("ckpt-1"))
	if err != nil {
		t.Fatalf("the prepare once the run can park: %v", err)
	}
	want = gym.NewReport(true, nil, map[string]int{"sessions": 1, "at_boundary": 1}, nil)
	if ready.Phase != gym.PhasePrepared || !sameReport(ready.Report, want) {
		t.Errorf("the prepare answered %s %+v, want prepared %+v", ready.Phase, ready.Report, want)
	}
	if info, _ := runInfo(p, ro); info.State != "parked" {
		t.Errorf("the run is %+v, want parked", info)
	}
	resume(t, p, "ckpt-1")
	r := h.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	checkVerified(t, e, ro, r)
}

// TestGymPrepareWaitsForParkAndReplays ports Gym's
// test_prepare_waits_for_parking_and_replays (control plane) and
// test_activation_parks_at_its_next_boundary_and_resumes (agent): a
// prepare with time to spare does not return while the run cannot park
// (its pause held), closes admission at once, returns prepared once the
// run is parked, and a second prepare of the same id answers the very same
// reply without closing anything again; after the resume the run goes on
// from where it parked and finishes, paused once, every step once.
func TestGymPrepareWaitsForParkAndReplays(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	pausing, release := holdPause(t, e)
	ro, h, _, sess := inHarness(t, e, rn, "waited", 1, nil)

	type outcome struct {
		rep *gym.PrepareReply
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		rep, err := c.Prepare(ctx, request("ckpt-1"))
		done <- outcome{rep, err}
	}()
	await(t, pausing, "the pause", h)
	select {
	case got := <-done:
		t.Fatalf("the prepare returned (%+v, %v) while the run could not park", got.rep, got.err)
	default:
	}
	if a := accepting(p); a != false {
		t.Errorf("accepting %v while the prepare waits, want false", a)
	}
	release()
	var first outcome
	select {
	case first = <-done:
	case <-time.After(drivertest.Patience):
		t.Fatalf("the prepare did not return once the run could park")
	}
	if first.err != nil || first.rep.Phase != gym.PhasePrepared {
		t.Fatalf("the prepare answered %+v, %v; want prepared", first.rep, first.err)
	}
	again, err := c.Prepare(ctx, request("ckpt-1"))
	if err != nil {
		t.Fatalf("the second prepare of ckpt-1: %v", err)
	}
	a, _ := json.Marshal(first.rep)
	b, _ := json.Marshal(again)
	if string(a) != string(b) {
		t.Errorf("the second prepare answered %s, want the first reply %s", b, a)
	}
	resume(t, p, "ckpt-1")
	r := h.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	checkVerified(t, e, ro, r)
	drivertest.CheckStepsOnce(t, sess, steps)
}

// TestGymQueuedRunDoesNotBlockAndIsExportedAtSeed ports Gym's
// test_an_episode_without_a_boundary_is_exported_and_restarts_from_its_input
// (episode steps: "every live episode is checkpointable"): with one slot,
// a second run waits for it; a prepare does not wait for that queued run
// (ready, no blockers, counts sessions 2), and the commit writes it as a
// Gym AgentSessionRecord at its seed bookmark: its episode id, session_key
// the rollout id, the fake adapter's session without state, boundary null,
// episode next=seed, without it having seeded. After the resume both runs
// finish verified.
func TestGymQueuedRunDoesNotBlockAndIsExportedAtSeed(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant(1)
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	first, ha, _, _ := inHarness(t, e, rn, "first", 0, nil)
	queued := e.Rollout("queued")
	hb := e.Start(rn, queued, 2, drivertest.Task(queued, steps, stepS, nil))
	testkit.Eventually(t, "the second run is queued", func() (bool, string) {
		info, ok := runInfo(p, queued)
		return ok && info.State == "queued", "not queued yet"
	})

	rep, err := p.Control().Prepare(ctx, request("ckpt-1"))
	if err != nil {
		t.Fatal(err)
	}
	want := gym.NewReport(true, nil, map[string]int{"sessions": 2, "at_boundary": 2}, nil)
	if rep.Phase != gym.PhasePrepared || !sameReport(rep.Report, want) {
		t.Errorf("the prepare answered %s %+v, want prepared %+v", rep.Phase, rep.Report, want)
	}
	dir := e.CheckpointDir("ckpt-1")
	got, err := p.Control().Commit(ctx, &gym.CommitRequest{Request: request("ckpt-1"), CheckpointDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if wantIDs := []string{key(first, 0), key(queued, 2)}; !slices.Equal(got.EpisodeIDs, wantIDs) {
		t.Errorf("the commit wrote %v, want %v", got.EpisodeIDs, wantIDs)
	}
	rec := readBack(t, dir)[key(queued, 2)]
	checks := map[string]string{
		"episode_id":  `{"rollout_id":"` + queued + `","attempt":2}`,
		"session_key": `"` + queued + `"`,
		"session":     `{"adapter":"fake"}`,
		"boundary":    `null`,
		"episode":     `{"v":1,"next":"seed"}`,
	}
	for field, w := range checks {
		var gv, wv any
		if json.Unmarshal(rec[field], &gv) != nil || json.Unmarshal([]byte(w), &wv) != nil || !reflect.DeepEqual(gv, wv) {
			t.Errorf("the queued run's record has %s = %s, want %s", field, rec[field], w)
		}
	}
	if n := e.Owner.Count(drivertest.CallSeed, queued); n != 0 {
		t.Errorf("the queued run seeded %d times during the checkpoint", n)
	}
	resume(t, p, "ckpt-1")
	checkVerified(t, e, first, ha.MustSucceed(t))
	checkVerified(t, e, queued, hb.MustSucceed(t))
}

// TestGymRestartRunNeverBlocksAndIsRefusedInScope ports Gym's
// test_an_episode_marked_restart_never_holds_up_prepare_and_is_left_out_of_the_commit
// (episode steps) and the restart rule of steps.py: a run whose seed reply
// carried x-ng-checkpoint-restart (the lending owner's "restart": true) is
// in its harness step beside an ordinary run; the prepare is ready without
// waiting for it, lists it in report.restarts (never as a blocker); a
// commit whose scope names it is refused with restart_in_scope before
// anything is written; the commit of the other run alone writes only that
// one. The restart's launch is never paused; both runs finish verified.
func TestGymRestartRunNeverBlocksAndIsRefusedInScope(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	restart, hr, _, _ := inHarness(t, e, rn, "restart", 1, map[string]any{"restart": true})
	kept, hk, _, _ := inHarness(t, e, rn, "kept", 1, nil)

	rep, err := c.Prepare(ctx, request("ckpt-1"))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Phase != gym.PhasePrepared || !rep.Report.Ready || len(rep.Report.Blockers) != 0 || !slices.Equal(rep.Report.Restarts, []string{key(restart, 1)}) {
		t.Errorf("the prepare answered %s %+v, want prepared with restarts [%s]", rep.Phase, rep.Report, key(restart, 1))
	}
	if st := c.Status(); !slices.Equal(st.Report.Restarts, []string{key(restart, 1)}) {
		t.Errorf("status reports restarts %v", st.Report.Restarts)
	}
	dir := e.CheckpointDir("ckpt-1")
	both := []gym.EpisodeID{{RolloutID: restart, Attempt: 1}, {RolloutID: kept, Attempt: 1}}
	_, err = c.Commit(ctx, &gym.CommitRequest{Request: request("ckpt-1"), CheckpointDir: dir, EpisodeIDs: both})
	checkCode(t, "a commit whose scope names the restart", err, gym.ErrRestartInScope, gym.CodeRestartInScope)
	if _, serr := os.Stat(filepath.Join(dir, "gym")); !os.IsNotExist(serr) {
		t.Errorf("the refused commit wrote something (%v)", serr)
	}
	got, err := c.Commit(ctx, &gym.CommitRequest{Request: request("ckpt-1"), CheckpointDir: dir, EpisodeIDs: both[1:]})
	if err != nil {
		t.Fatalf("the commit without the restart: %v", err)
	}
	if !slices.Equal(got.EpisodeIDs, []string{key(kept, 1)}) {
		t.Errorf("the commit wrote %v, want [%s]", got.EpisodeIDs, key(kept, 1))
	}
	if recs := readBack(t, dir); len(recs) != 1 || recs[key(kept, 1)] == nil {
		t.Errorf("the checkpoint holds %d records, want only %s's", len(recs), kept)
	}
	resume(t, p, "ckpt-1")
	rr, rk := hr.MustSucceed(t), hk.MustSucceed(t)
	if len(rr.Launches) != 1 || rr.Launches[0].Pauses != 0 {
		t.Errorf("the restart's launches %+v: want one, never paused", rr.Launches)
	}
	if n := len(drivertest.ForLaunch(e.Backend.Verbs("pause"), rr.Launches[0].ID)); n != 0 {
		t.Errorf("the restart's launch was paused %d times", n)
	}
	checkVerified(t, e, restart, rr)
	checkVerified(t, e, kept, rk)
}

// TestGymNewRolloutRefusedWhileAdmissionClosed ports Gym's
// test_activation_invoked_while_closed_parks_before_doing_work (agent:
// open_session of another rollout raises AdmissionClosedError while
// closed) and the refused /run of
// test_an_agent_without_session_hooks_blocks_checkpoints_until_its_rollouts_retire
// (code checkpoint_parked): while a checkpoint is prepared, a /run of a
// new rollout is refused with 409 checkpoint_parked before the owner is
// called, and status says accepting false; after the resume the same /run
// is admitted and finishes verified.
func TestGymNewRolloutRefusedWhileAdmissionClosed(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	ro := e.Rollout("new")
	body := drivertest.Task(ro, 3, 0.1, nil)

	prepare(t, p, "ckpt-1")
	_, err := rn.Run(ctx, driver.RunRequest{RolloutID: ro, Body: body})
	checkCode(t, "a new rollout while the checkpoint is prepared", err, gym.ErrCheckpointParked, gym.CodeCheckpointParked)
	if calls := e.Owner.Calls(ro); len(calls) != 0 {
		t.Errorf("the refused run called the owner: %+v", calls)
	}
	if a := accepting(p); a != false {
		t.Errorf("accepting %v while prepared, want false", a)
	}
	resume(t, p, "ckpt-1")
	if a := accepting(p); a != true {
		t.Errorf("accepting %v after the resume, want true", a)
	}
	checkVerified(t, e, ro, e.Start(rn, ro, 0, body).MustSucceed(t))
}

// TestGymRestoreRefusedWhileRunsInFlight ports the refusal of Gym's
// AgentSessionParticipant.install ("agent restore requires a process
// without live sessions") with test_invalid_record_leaves_participant_open_and_idle
// (control plane): a restore while a run is in its harness is refused with
// 409 checkpoint_error naming the live run, nothing is installed, the
// participant is idle and accepting again, and the run goes on and finishes
// verified; once no run is in flight the same records restore.
func TestGymRestoreRefusedWhileRunsInFlight(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro, h, _, _ := inHarness(t, e, rn, "live", 1, nil)
	other := e.Rollout("other")
	recs := []record{{RolloutID: other, Attempt: 0, Bookmark: json.RawMessage(`{"v":1,"next":"seed"}`)}}

	err := restoreRecords(t, p, recs)
	checkCode(t, "a restore with a run in flight", err, gym.ErrRefused, gym.CodeRefused)
	if err != nil && !contains(err.Error(), key(ro, 1)) {
		t.Errorf("the refusal %q does not name the live run %s", err, key(ro, 1))
	}
	if st := p.Control().Status(); st.Phase != gym.PhaseIdle || st.Extra["accepting"] != true {
		t.Errorf("after the refused restore: phase %s accepting %v, want idle and open", st.Phase, st.Extra["accepting"])
	}
	if pending, _ := p.RestoredPending(ctx); len(pending) != 0 {
		t.Errorf("the refused restore installed %v", pending)
	}
	checkVerified(t, e, ro, h.MustSucceed(t))
	if err := restoreRecords(t, p, recs); err != nil {
		t.Fatalf("the restore once no run is in flight: %v", err)
	}
	if pending, _ := p.RestoredPending(ctx); !reflect.DeepEqual(pending, []gym.EpisodeID{{RolloutID: other, Attempt: 1}}) {
		t.Errorf("restored pending %v, want %s", pending, key(other, 1))
	}
}

// TestGymRestoreInstallsUnderNextAttempt ports Gym's
// test_restore_installs_sessions_under_the_next_attempt (agent): a run of
// attempt 1 committed while parked in its harness, then crashed, restores
// into a new participant as attempt 2 (restored ["<id>-a2"], source
// ckpt-1); a /run of attempt 1 or of attempt 3 is refused with
// stale_attempt while the record waits; the /run of attempt 2 claims it
// and continues the saved session (its relaunch resumed, going on past
// step 1), verified; the record is claimed once: nothing is pending or
// exported afterwards.
func TestGymRestoreInstallsUnderNextAttempt(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p1 := drivertest.NewParticipant()
	ro, h1, _, _ := inHarness(t, e, e.Runner(drivertest.Fake(steps, stepS), p1), "restored", 1, nil)
	body := drivertest.Task(ro, steps, stepS, nil)
	prepare(t, p1, "ckpt-1")
	recs := commit(t, e, p1, "ckpt-1", false)
	resume(t, p1, "ckpt-1")
	h1.Cancel(driver.ErrCrashed)
	if _, err := h1.Wait(t); !errors.Is(err, driver.ErrCrashed) {
		t.Fatalf("the crashed run returned %v", err)
	}
	restoreOwner(t, e, "ckpt-1", recs)

	p2 := drivertest.NewParticipant()
	c2 := p2.Control()
	rep, err := c2.Restore(ctx, &gym.RestoreRequest{Request: request("restore-1"), CheckpointDir: e.CheckpointDir("ckpt-1"),
		EpisodeIDs: []gym.EpisodeID{{RolloutID: ro, Attempt: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Phase != gym.PhaseRestored || rep.SourceCheckpointID != "ckpt-1" || !slices.Equal(rep.Restored, []string{key(ro, 2)}) {
		t.Errorf("the restore answered %+v, want restored [%s] from ckpt-1", rep, key(ro, 2))
	}
	resume(t, p2, "restore-1")
	rn2 := e.Runner(drivertest.Fake(steps, stepS), p2)
	for _, attempt := range []int{1, 3} {
		_, err := rn2.Run(ctx, driver.RunRequest{RolloutID: ro, Attempt: attempt, Body: body})
		checkCode(t, "a /run of attempt "+itoa(attempt)+" of the restored rollout", err, gym.ErrStaleAttempt, gym.CodeStaleAttempt)
	}
	r := e.Start(rn2, ro, 2, body).MustSucceed(t)
	if len(r.Launches) != 2 || !r.Launches[1].Resumed || r.Fake.FirstStep <= 1 {
		t.Errorf("attempt 2 did not continue the saved session: launches %+v, harness output %+v", r.Launches, r.Fake)
	}
	checkVerified(t, e, ro, r)
	if pending, _ := p2.RestoredPending(ctx); len(pending) != 0 {
		t.Errorf("restored pending after the claim: %v", pending)
	}
	if res := prepare(t, p2, "ckpt-2"); len(res.Records) != 0 {
		t.Errorf("a checkpoint after the claimed run ended exports %+v", res.Records)
	}
	resume(t, p2, "ckpt-2")
}

// TestGymRetireCancelsAndFencesRunningRun ports Gym's
// test_retire_cancels_the_activation_and_fences_the_attempt (agent) and
// test_retire_cancels_and_fences_the_running_attempt (the proof agent's
// legacy /run), read against control.py at 011c338, where a retire is
// refused while a checkpoint is open: a run that made a prepare miss its
// deadline cannot be retired until the resume (invalid_phase); then the
// retire cancels it and replies only once its /run has returned
// (cancelled), its launch killed and no process left in its sandbox, its
// session closed without a verdict. Until forget, a /run of that attempt
// or an earlier one is stale_attempt (retired_rollouts 1); the next
// prepare is ready and exports nothing. After forget the attempt is no
// longer refused, and the next attempt runs to the end.
func TestGymRetireCancelsAndFencesRunningRun(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
	pausing, release := holdPause(t, e)
	ro := e.Rollout("retired")
	body := drivertest.Task(ro, pauseSteps, stepS, nil)
	run := e.StartRunning(rn, ro, 1, body, drivertest.Until{Steps: 1, Kinds: allKinds})

	missed, err := c.Prepare(ctx, reqAt("ckpt-1", 300*time.Millisecond))
	if err != nil || missed.Phase != gym.PhasePreparing {
		t.Fatalf("the prepare answered %+v, %v; want preparing", missed, err)
	}
	retire := &gym.RetireRequest{Request: request("ckpt-1"), EpisodeIDs: []gym.EpisodeID{{RolloutID: ro, Attempt: 1}}}
	_, err = c.Retire(ctx, retire)
	checkCode(t, "a retire while the checkpoint is open", err, gym.ErrInvalidPhase, gym.CodeInvalidPhase)
	await(t, pausing, "the pause", run.Handle)
	resume(t, p, "ckpt-1")
	release()

	retire.Request = request("retire-1")
	rep, err := c.Retire(ctx, retire)
	if err != nil {
		t.Fatalf("retire: %v", err)
	}
	// Replied once the run ended: unregistered, its session closed (its
	// /run returns right after).
	if _, ok := runInfo(p, ro); ok || !e.Session(ro).Closed {
		t.Fatalf("the retire replied before the run ended (registered %v, session %+v)", ok, e.Session(ro))
	}
	if _, err := run.Wait(t); !errors.Is(err, driver.ErrCancelled) {
		t.Errorf("the retired run returned %v, want ErrCancelled", err)
	}
	if !slices.Equal(rep.Retired, []string{key(ro, 1)}) {
		t.Errorf("the retire answered %v", rep.Retired)
	}
	drivertest.CheckGone(t, "after the retire", run.Procs)
	e.CheckNoProcs("after the retire", run.SandboxID)
	if s := e.Session(ro); !s.Closed || s.Verified {
		t.Errorf("the owner's session: closed %v verified %v; want closed without a verdict", s.Closed, s.Verified)
	}
	if n := c.Status().RetiredRollouts; n != 1 {
		t.Errorf("retired_rollouts %d, want 1", n)
	}
	for _, attempt := range []int{1, 0} {
		_, err := rn.Run(ctx, driver.RunRequest{RolloutID: ro, Attempt: attempt, Body: body})
		checkCode(t, "a /run of retired attempt "+itoa(attempt), err, gym.ErrStaleAttempt, gym.CodeStaleAttempt)
	}
	if res := prepare(t, p, "ckpt-2"); len(res.Records) != 0 {
		t.Errorf("the checkpoint after the retire exports %+v", res.Records)
	}
	resume(t, p, "ckpt-2")

	fr, err := c.Forget(ctx, &gym.ForgetRequest{Request: request("forget-1"), RolloutIDs: []string{ro}})
	if err != nil || !slices.Equal(fr.Forgotten, []string{ro}) {
		t.Fatalf("forget answered %+v, %v", fr, err)
	}
	if n := c.Status().RetiredRollouts; n != 0 {
		t.Errorf("retired_rollouts %d after forget, want 0", n)
	}
	// The driver admits attempt 1 again (the owner, which keys sessions by
	// capture key, refuses to seed its closed session again: that refusal
	// is the owner's); attempt 2 runs to the end.
	if _, err := rn.Run(ctx, driver.RunRequest{RolloutID: ro, Attempt: 1, Body: drivertest.Task(ro, 3, 0.1, nil)}); errors.Is(err, gym.ErrStaleAttempt) {
		t.Errorf("attempt 1 after forget: %v", err)
	}
	checkVerified(t, e, ro, e.Start(rn, ro, 2, drivertest.Task(ro, 3, 0.1, nil)).MustSucceed(t))
}

// TestGymRetireDropsRestoredRecord ports Gym's
// test_restored_state_can_be_retired_after_resume (control plane) and
// test_commit_restore_round_trip_and_retire_after_restore (environment): a
// restored record not yet claimed (restored pending <id>-a2, counted among
// the sessions) is dropped by a retire of its attempt; the next commit
// does not write it, and a /run of that attempt is stale_attempt.
func TestGymRetireDropsRestoredRecord(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	ro := e.Rollout("dropped")
	if err := restoreRecords(t, p, []record{{RolloutID: ro, Attempt: 1, Bookmark: json.RawMessage(`{"v":1,"next":"seed"}`)}}); err != nil {
		t.Fatal(err)
	}
	if pending, _ := p.RestoredPending(ctx); !reflect.DeepEqual(pending, []gym.EpisodeID{{RolloutID: ro, Attempt: 2}}) {
		t.Fatalf("restored pending %v, want %s", pending, key(ro, 2))
	}
	// Gym counts an installed, unclaimed session among the sessions.
	if n := c.Status().Report.Counts["sessions"]; n != 1 {
		t.Errorf("status counts %d sessions with one restored record, want 1", n)
	}
	if _, err := c.Retire(ctx, &gym.RetireRequest{Request: request("cleanup"), EpisodeIDs: []gym.EpisodeID{{RolloutID: ro, Attempt: 2}}}); err != nil {
		t.Fatalf("retire: %v", err)
	}
	if pending, _ := p.RestoredPending(ctx); len(pending) != 0 {
		t.Errorf("restored pending %v after the retire", pending)
	}
	if n := c.Status().Report.Counts["sessions"]; n != 0 {
		t.Errorf("status counts %d sessions after the retire, want 0", n)
	}
	prepare(t, p, "ckpt-1")
	dir := e.CheckpointDir("ckpt-1")
	got, err := c.Commit(ctx, &gym.CommitRequest{Request: request("ckpt-1"), CheckpointDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.EpisodeIDs) != 0 || len(readBack(t, dir)) != 0 {
		t.Errorf("the commit after the retire wrote %v", got.EpisodeIDs)
	}
	resume(t, p, "ckpt-1")
	_, err = rn.Run(ctx, driver.RunRequest{RolloutID: ro, Attempt: 2, Body: drivertest.Task(ro, 3, 0.1, nil)})
	checkCode(t, "a /run of the retired restored attempt", err, gym.ErrStaleAttempt, gym.CodeStaleAttempt)
}

// TestGymCommitScopeDeletesUnscopedRestored ports Gym's
// test_a_commit_that_no_longer_continues_a_restored_episode_retires_it
// (environment) and control.py's _delete_unscoped: after a restore of two
// rollouts, a commit whose scope names only one writes only that one and
// deletes the other's restored record (restored pending is the scoped one
// alone), without refusing its attempt: its /run later starts from its
// input (it seeds and runs the harness, verified) instead of returning the
// stored result, while the scoped one's /run returns its stored result
// without seeding.
func TestGymCommitScopeDeletesUnscopedRestored(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	keep, drop := e.Rollout("keep"), e.Rollout("drop")
	stored := json.RawMessage(`{"v":1,"next":"return","result":{"reward":1,"stored":true}}`)
	if err := restoreRecords(t, p, []record{{RolloutID: keep, Attempt: 0, Bookmark: stored}, {RolloutID: drop, Attempt: 0, Bookmark: stored}}); err != nil {
		t.Fatal(err)
	}
	prepare(t, p, "ckpt-2")
	dir := e.CheckpointDir("ckpt-2")
	got, err := c.Commit(ctx, &gym.CommitRequest{Request: request("ckpt-2"), CheckpointDir: dir, EpisodeIDs: []gym.EpisodeID{{RolloutID: keep, Attempt: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.EpisodeIDs, []string{key(keep, 1)}) {
		t.Errorf("the commit wrote %v, want [%s]", got.EpisodeIDs, key(keep, 1))
	}
	if recs := readBack(t, dir); len(recs) != 1 || recs[key(keep, 1)] == nil {
		t.Errorf("the checkpoint holds %d records, want only %s's", len(recs), keep)
	}
	if pending, _ := p.RestoredPending(ctx); !reflect.DeepEqual(pending, []gym.EpisodeID{{RolloutID: keep, Attempt: 1}}) {
		t.Errorf("restored pending %v after the commit, want only %s", pending, key(keep, 1))
	}
	resume(t, p, "ckpt-2")

	out, err := rn.Run(ctx, driver.RunRequest{RolloutID: keep, Attempt: 1, Body: drivertest.Task(keep, 3, 0.1, nil)})
	if err != nil || !contains(string(out), `"stored":true`) {
		t.Errorf("the scoped rollout returned %s, %v; want its stored result", out, err)
	}
	if n := e.Owner.Count(drivertest.CallSeed, keep); n != 0 {
		t.Errorf("the scoped rollout seeded %d times", n)
	}
	r := e.Start(rn, drop, 1, drivertest.Task(drop, 3, 0.1, nil)).MustSucceed(t)
	if contains(string(r.Raw), `"stored"`) || e.Owner.Count(drivertest.CallSeed, drop) != 1 || len(r.Launches) != 1 {
		t.Errorf("the deleted rollout did not start from its input: %s", r.Raw)
	}
	checkVerified(t, e, drop, r)
}

// TestGymLeaseExpiryResumesOnItsOwn ports Gym's
// test_lease_expiry_resumes_a_participant_whose_controller_went_quiet
// (control plane) on the driver's participant: with a lease grace of
// 300 ms and a prepare whose deadline is just ahead, the checkpoint that
// nobody calls again resumes on its own, saying so in the log (as Gym's
// warning does): phase idle, accepting, the
// parked run goes on and finishes (paused once, verified), a new rollout
// is admitted, and a commit of the expired checkpoint is stale_checkpoint.
func TestGymLeaseExpiryResumesOnItsOwn(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	var mu sync.Mutex
	var logged []string
	logf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, fmt.Sprintf(format, args...))
	}
	p := driver.MustParticipant(driver.ParticipantConfig{Adapter: "fake", LeaseGrace: 300 * time.Millisecond, Logf: logf})
	c := p.Control()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro, h, _, _ := inHarness(t, e, rn, "leased", 1, nil)

	rep, err := c.Prepare(ctx, reqAt("ckpt-1", 4*time.Second))
	if err != nil || rep.Phase != gym.PhasePrepared {
		t.Fatalf("the prepare answered %+v, %v; want prepared", rep, err)
	}
	testkit.Eventually(t, "the lease expires and the checkpoint resumes", func() (bool, string) {
		st := c.Status()
		return st.Phase == gym.PhaseIdle, "phase " + string(st.Phase)
	})
	if a := accepting(p); a != true {
		t.Errorf("accepting %v after the lease expired, want true", a)
	}
	mu.Lock()
	said := slices.ContainsFunc(logged, func(l string) bool { return contains(l, "ckpt-1 lease expired") })
	mu.Unlock()
	if !said {
		t.Errorf("the expiry was not logged: %q", logged)
	}
	_, err = c.Commit(ctx, &gym.CommitRequest{Request: request("ckpt-1"), CheckpointDir: e.CheckpointDir("ckpt-1")})
	checkCode(t, "a commit of the expired checkpoint", err, gym.ErrStaleCheckpoint, gym.CodeStaleCheckpoint)
	r := h.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 1, false)
	checkVerified(t, e, ro, r)
	late := e.Rollout("late")
	checkVerified(t, e, late, e.Start(rn, late, 0, drivertest.Task(late, 3, 0.1, nil)).MustSucceed(t))
}

// TestGymRestoredReplacementAdmittedWhileClosed ports the agent side of
// Gym's test_new_episodes_are_refused_while_closed_but_restored_ones_start
// (AgentSessionParticipant.open_session admits the restored session's own
// attempt whatever admission says; its episode then parks at its first
// boundary): while a checkpoint after the restore is prepared, the /run of
// the restored attempt is admitted, never blocks (still ready), waits
// queued at the restored bookmark, which is exported as that attempt's,
// and returns its stored result after the resume without seeding; a new
// rollout is refused with checkpoint_parked meanwhile.
func TestGymRestoredReplacementAdmittedWhileClosed(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	ro := e.Rollout("replacement")
	stored := json.RawMessage(`{"v":1,"next":"return","result":{"reward":1,"stored":true}}`)
	if err := restoreRecords(t, p, []record{{RolloutID: ro, Attempt: 2, Bookmark: stored}}); err != nil {
		t.Fatal(err)
	}
	prepare(t, p, "ckpt-1")
	h := e.Start(rn, ro, 3, drivertest.Task(ro, 3, 0.1, nil))
	testkit.Eventually(t, "the restored attempt is admitted", func() (bool, string) {
		_, ok := runInfo(p, ro)
		return ok, "not registered"
	})
	if rep := p.Readiness(); !rep.Ready {
		t.Errorf("the admitted replacement blocks the checkpoint: %+v", rep)
	}
	recs, err := p.Export(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := toRecords(t, recs); len(got) != 1 || got[0].Attempt != 3 || string(got[0].Bookmark) != string(stored) {
		t.Errorf("while it waits the checkpoint exports %+v, want attempt 3 at %s", got, stored)
	}
	other := e.Rollout("other")
	_, err = rn.Run(ctx, driver.RunRequest{RolloutID: other, Body: drivertest.Task(other, 3, 0.1, nil)})
	checkCode(t, "a new rollout while closed", err, gym.ErrCheckpointParked, gym.CodeCheckpointParked)
	resume(t, p, "ckpt-1")
	out, err := h.Wait(t)
	if err != nil || !contains(string(out), `"stored":true`) {
		t.Errorf("the restored attempt returned %s, %v; want its stored result", out, err)
	}
	if n := e.Owner.Count(drivertest.CallSeed, ro); n != 0 {
		t.Errorf("the restored attempt seeded %d times", n)
	}
}

// TestGymRunBecomesRestartOnlyOutsideCheckpoint ports steps.py's rule (at
// 05bf55a, EpisodeSteps.mark_restart waits while admission is closed) that
// "an episode becomes a restart only while no checkpoint is open, so the
// episodes a checkpoint exports and the restarts it reports never change
// during it": a run in its seed step when the checkpoint opens is exported
// at seed and is no restart; its seed then answers with the restart header
// during the checkpoint. Until the resume it must stay out of
// report.restarts, keep its record, and a commit whose scope names it (as
// the controller computed it from the prepare) must succeed. After the
// resume it is a restart and finishes verified.
func TestGymRunBecomesRestartOnlyOutsideCheckpoint(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	ro := e.Rollout("late-restart")
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	e.Owner.BeforeSeed(func(ctx context.Context, rollout string) error {
		close(entered)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	h := e.Start(rn, ro, 0, drivertest.Task(ro, 3, 0.1, map[string]any{"restart": true}))
	await(t, entered, "the seed", h)
	res := prepare(t, p, "ckpt-1")
	if _, bm := bookmarkOf(t, res.Records, ro); bm.Next != driver.StageSeed {
		t.Errorf("the run in its seed step was exported at %s, want seed", bm.Next)
	}
	once.Do(func() { close(release) })
	testkit.Eventually(t, "the seed has returned", func() (bool, string) {
		n := e.Owner.Count(drivertest.CallSeed, ro)
		return n == 1, fmt.Sprintf("%d seeds", n)
	})
	// Given time to move on, the run must not: it waits at its seed
	// bookmark, exported, until the checkpoint opens.
	time.Sleep(500 * time.Millisecond)
	if info, _ := runInfo(p, ro); info.State != "replay" || info.Next != driver.StageSeed {
		t.Errorf("during the checkpoint the run is %+v, want still in its seed step", info)
	}
	if rs := p.Readiness().Restarts; len(rs) != 0 {
		t.Errorf("the run became a restart during the checkpoint: restarts %v", rs)
	}
	if n := len(e.Backend.Verbs("run")); n != 0 {
		t.Errorf("the run launched its harness during the checkpoint (%d ngsup run)", n)
	}
	dir := e.CheckpointDir("ckpt-1")
	got, err := c.Commit(ctx, &gym.CommitRequest{Request: request("ckpt-1"), CheckpointDir: dir, EpisodeIDs: []gym.EpisodeID{{RolloutID: ro}}})
	if err != nil {
		t.Errorf("the commit of the scope the prepare reported: %v", err)
	} else if !slices.Equal(got.EpisodeIDs, []string{key(ro, 0)}) {
		t.Errorf("the commit wrote %v, want [%s]", got.EpisodeIDs, key(ro, 0))
	}
	resume(t, p, "ckpt-1")
	checkVerified(t, e, ro, h.MustSucceed(t))
}

// heldCheck is a check for the lending owner's verify that waits until the
// test lets it go (a file named verify-go in the workdir), then checks the
// fake harness's n steps.
func heldCheck(n int) string {
	return `while [ ! -e verify-go ]; do sleep 0.05; done; test "$(grep -c '^step' progress)" -ge ` + itoa(n)
}

// inVerify starts rollout name with a held check (and extra fields) and
// waits until its run is in the verify step; letGo lets the check finish.
func inVerify(t *testing.T, e *drivertest.Env, rn *driver.Runner, p *driver.Participant, name string, extra map[string]any) (ro string, h *drivertest.Handle, letGo func()) {
	t.Helper()
	ro = e.Rollout(name)
	fields := map[string]any{"check": heldCheck(3)}
	for k, v := range extra {
		fields[k] = v
	}
	h = e.Start(rn, ro, 1, drivertest.Task(ro, 3, 0.1, fields))
	testkit.Eventually(t, "the run is in its verify step", func() (bool, string) {
		info, _ := runInfo(p, ro)
		return info.Next == driver.StageVerify, "next " + string(info.Next)
	})
	// The owner holds its session while the check runs: find the sandbox
	// (the Env's only one) without asking it.
	sbs := e.Sandboxes()
	if len(sbs) != 1 {
		t.Fatalf("want the run's one sandbox, got %v", sbs)
	}
	sb, err := e.Open(sbs[0])
	if err != nil {
		t.Fatal(err)
	}
	flag := e.HostOf(sbs[0], filepath.Join(sb.Workdir(), "verify-go"))
	var once sync.Once
	letGo = func() {
		once.Do(func() {
			if err := os.WriteFile(flag, nil, 0o644); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(letGo)
	return ro, h, letGo
}

// TestGymWaitVerifyBlocksPrepare ports Gym's
// test_a_wait_step_blocks_prepare_until_its_result_is_recorded
// (environment) and the first half of
// test_nonreplayable_verify_waits_and_saves_completed_result (the proof
// agent's legacy /run): the owner did not mark its verify replayable, so a
// run inside its verify makes a prepare miss its deadline with the run's
// capture key as the blocker; once the check finishes the same prepare is
// ready, and the verify ran once: the run is verified without grading
// again.
func TestGymWaitVerifyBlocksPrepare(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	ro, h, letGo := inVerify(t, e, rn, p, "wait-verify", nil)

	missed, err := c.Prepare(ctx, reqAt("ckpt-1", 300*time.Millisecond))
	if err != nil || missed.Phase != gym.PhasePreparing || !slices.Equal(missed.Report.Blockers, []string{key(ro, 1)}) {
		t.Fatalf("the prepare answered %+v, %v; want preparing with blocker %s", missed, err, key(ro, 1))
	}
	letGo()
	if rep, err := c.Prepare(ctx, request("ckpt-1")); err != nil || rep.Phase != gym.PhasePrepared {
		t.Fatalf("the prepare once the verify finished answered %+v, %v", rep, err)
	}
	resume(t, p, "ckpt-1")
	checkVerified(t, e, ro, h.MustSucceed(t))
	if n := e.Owner.Count(drivertest.CallVerify, ro); n != 1 {
		t.Errorf("the owner graded %d times, want once", n)
	}
}

// TestGymReplayVerifyDoesNotBlock ports Gym's
// test_a_replay_step_does_not_block_and_its_result_waits_at_the_next_boundary
// (environment; the first half) and test_disk_restore_matches_uninterrupted_progress
// at ("verify", 0) (proof agent): an owner whose seed reply said
// x-ng-checkpoint-verify: replay (the lending owner's "verify_mode":
// "replay") lets a prepare be ready while the run is inside its verify;
// the run is exported at the bookmark before the step (next verify, the
// harness's response in it), so a restore would grade again. After the
// resume the run is verified.
func TestGymReplayVerifyDoesNotBlock(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	ro, h, letGo := inVerify(t, e, rn, p, "replay-verify", map[string]any{"verify_mode": "replay"})

	res := prepare(t, p, "ckpt-1")
	rec, bm := bookmarkOf(t, res.Records, ro)
	if bm.Next != driver.StageVerify || len(bm.Response) == 0 || rec.Attempt != 1 {
		t.Errorf("the run inside a replay verify was exported as %s, want its verify bookmark", rec.Bookmark)
	}
	recs := commitDriver(t, e, p, "ckpt-1")
	if _, bm := bookmarkOf(t, recs, ro); bm.Next != driver.StageVerify {
		t.Errorf("the commit holds the run at %s, want verify", bm.Next)
	}
	resume(t, p, "ckpt-1")
	letGo()
	checkVerified(t, e, ro, h.MustSucceed(t))
}

// TestGymStepEndingDuringCheckpointParksBeforeReplying ports the second
// half of Gym's test_nonreplayable_verify_waits_and_saves_completed_result
// (proof agent: after the held verify completes, the commit holds the run
// at next "return" with the result, and its /run is still running) and of
// test_a_replay_step_does_not_block_and_its_result_waits_at_the_next_boundary
// (the result waits at the next boundary until resume), per steps.py: a
// step that ends while a checkpoint is open parks the episode at its next
// boundary. A run whose verify finishes during the checkpoint must park
// at its return bookmark (exported with the reward) and reply only after
// the resume.
func TestGymStepEndingDuringCheckpointParksBeforeReplying(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"wait", "replay"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := drivertest.New(t)
			p := drivertest.NewParticipant()
			rn := e.Runner(drivertest.Fake(3, 0.1), p)
			extra := map[string]any{}
			if mode == "replay" {
				extra["verify_mode"] = "replay"
			}
			ro, h, letGo := inVerify(t, e, rn, p, mode+"-verify", extra)
			prepared := make(chan error, 1)
			go func() {
				rep, err := p.Control().Prepare(context.Background(), request("ckpt-1"))
				if err == nil && rep.Phase != gym.PhasePrepared {
					err = fmt.Errorf("phase %s, blockers %v", rep.Phase, rep.Report.Blockers)
				}
				prepared <- err
			}()
			testkit.Eventually(t, "admission is closed", func() (bool, string) {
				return accepting(p) == false, "still accepting"
			})
			letGo()
			testkit.Eventually(t, "the verify has ended", func() (bool, string) {
				info, ok := runInfo(p, ro)
				select {
				case <-h.Done():
					return true, ""
				default:
				}
				return ok && info.State == "parked", "state " + info.State + " next " + string(info.Next)
			})
			replied := false
			select {
			case <-h.Done():
				replied = true
			default:
			}
			if err := <-prepared; err != nil {
				t.Fatalf("prepare: %v", err)
			}
			if replied {
				out, err := h.Wait(t)
				t.Fatalf("the run replied during the checkpoint (%v): %.200s", err, out)
			}
			recs := commitDriver(t, e, p, "ckpt-1")
			if _, bm := bookmarkOf(t, recs, ro); bm.Next != driver.StageReturn || !contains(string(bm.Result), `"reward":1`) {
				t.Errorf("the commit holds the run at %s (%s), want return with its reward", bm.Next, bm.Result)
			}
			resume(t, p, "ckpt-1")
			checkVerified(t, e, ro, h.MustSucceed(t))
		})
	}
}

// TestGymRetireCutShortBlocksNextPrepare ports Gym's
// test_an_episode_whose_retire_was_cut_short_blocks_the_next_prepare
// (environment; EpisodeSteps.retire keeps a retired episode blocking until
// its task has ended): the retired run cannot end yet, either because its
// cleanup's `ngsup stop` is held (a run in its harness) or because its
// seed is held and ignores the cancellation (a run in its seed step, which
// alone would not block), so a retire whose deadline passes first answers
// deadline_exceeded; the run is still being stopped, so the next prepare
// misses its deadline with it as the blocker instead of exporting it, and
// a commit then is invalid_phase. After the resume and once the run may
// end, the retried retire replies after the run ended, and nothing of it
// is left in its sandbox.
func TestGymRetireCutShortBlocksNextPrepare(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"harness", "seed"} {
		t.Run(where, func(t *testing.T) {
			t.Parallel()
			e := drivertest.New(t)
			ctx := context.Background()
			p := drivertest.NewParticipant()
			c := p.Control()
			rn := e.Runner(drivertest.Fake(pauseSteps, stepS), p)
			held, letGo := make(chan struct{}), make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(letGo) }) })
			ro := e.Rollout("slow-" + where)
			var h *drivertest.Handle
			if where == "seed" {
				// Held whatever the run's context says: the seed step
				// cannot end before the test lets it. Set before the run
				// starts, so its seed cannot slip past it.
				e.Owner.BeforeSeed(func(context.Context, string) error {
					close(held)
					<-letGo
					return nil
				})
				h = e.Start(rn, ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
				await(t, held, "the seed", h)
				held = nil
			} else {
				h = e.Start(rn, ro, 1, drivertest.Task(ro, pauseSteps, stepS, nil))
				var first sync.Once
				e.Backend.SetHook(func(ctx context.Context, sb sandboxT, req execReq, next drivertest.Next) (execRes, error) {
					if len(req.Argv) > 1 && drivertest.IsNgsup(req.Argv[0]) && req.Argv[1] == "stop" {
						mine := false
						first.Do(func() { mine = true })
						if mine {
							close(held)
							select {
							case <-letGo:
							case <-ctx.Done():
								return execRes{ExitCode: -1}, ctx.Err()
							}
						}
					}
					return next(ctx, req)
				})
				e.WaitRunning(h, drivertest.Until{Steps: 1})
			}
			retire := &gym.RetireRequest{Request: reqAt("retire-1", 500*time.Millisecond), EpisodeIDs: []gym.EpisodeID{{RolloutID: ro, Attempt: 1}}}
			_, err := c.Retire(ctx, retire)
			checkCode(t, "a retire whose run is still stopping at its deadline", err, gym.ErrDeadlineExceeded, gym.CodeDeadlineExceeded)
			if held != nil {
				await(t, held, "the cleanup's stop", h)
			}

			missed, err := c.Prepare(ctx, reqAt("ckpt-2", 300*time.Millisecond))
			if err != nil || missed.Phase != gym.PhasePreparing || !slices.Equal(missed.Report.Blockers, []string{key(ro, 1)}) {
				t.Errorf("the prepare answered %+v, %v; want preparing with the retired run %s as blocker", missed, err, key(ro, 1))
			}
			_, err = c.Commit(ctx, &gym.CommitRequest{Request: request("ckpt-2"), CheckpointDir: e.CheckpointDir("ckpt-2")})
			checkCode(t, "a commit while preparing", err, gym.ErrInvalidPhase, gym.CodeInvalidPhase)
			resume(t, p, "ckpt-2")

			once.Do(func() { close(letGo) })
			retire.Request = request("retire-1")
			if _, err := c.Retire(ctx, retire); err != nil {
				t.Fatalf("the retried retire: %v", err)
			}
			// Replied once the run ended: unregistered, its session (if the
			// cancelled seed made one) closed; its /run returns right after.
			if _, ok := runInfo(p, ro); ok {
				t.Fatalf("the retried retire replied before the run ended")
			}
			if where == "harness" && !e.Session(ro).Closed {
				t.Errorf("the retried retire replied before the run's session was closed: %+v", e.Session(ro))
			}
			// A cancelled seed reports the owner's context.Canceled (serve
			// answers both 499 cancelled).
			if _, err := h.Wait(t); !errors.Is(err, driver.ErrCancelled) && !errors.Is(err, context.Canceled) {
				t.Errorf("the retired run returned %v, want it cancelled", err)
			}
			e.CheckNoProcs("after the retire")
		})
	}
}
