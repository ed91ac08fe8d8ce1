package driver_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/gym"
)

// runInfo returns the participant's view of rollout (ok false if it is not
// registered).
func runInfo(p *driver.Participant, rollout string) (driver.RunInfo, bool) {
	runs := p.Runs()
	i := slices.IndexFunc(runs, func(r driver.RunInfo) bool { return r.RolloutID == rollout })
	if i < 0 {
		return driver.RunInfo{}, false
	}
	return runs[i], true
}

// TestQueuedRunExportedAtSeed proves that a run queued for a concurrency
// slot (NewParticipant(1), two runs) is registered at its seed bookmark
// before it waits (Participant.Runs shows it queued with next=seed), that
// Prepare exports it at that bookmark while the first run is parked
// (paused), without waiting for it and without it seeding, and that it
// runs after the resume; both are verified.
func TestQueuedRunExportedAtSeed(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant(1)
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	first, queued := e.Rollout("first"), e.Rollout("queued")
	runA := e.StartRunning(rn, first, 1, drivertest.Task(first, steps, stepS, nil), drivertest.Until{Steps: 1})
	hb := e.Start(rn, queued, 1, drivertest.Task(queued, steps, stepS, nil))
	testkit.Eventually(t, "the second runA is registered", func() (bool, string) {
		_, ok := runInfo(p, queued)
		return ok, "not registered"
	})
	if info, _ := runInfo(p, queued); info.State != "queued" || info.Next != driver.StageSeed || info.Attempt != 1 {
		t.Errorf("the queued runA is %+v, want queued at seed", info)
	}

	res := prepare(t, p, "ckpt-1")
	_, bmA := bookmarkOf(t, res.Records, first)
	if bmA.Paused == nil {
		t.Errorf("the first runA was not exported paused: %+v", bmA)
	}
	rec, bmB := bookmarkOf(t, res.Records, queued)
	if bmB.Next != driver.StageSeed || rec.Attempt != 1 || len(bmB.Launches) != 0 {
		t.Errorf("the queued runA was exported as %s, want its seed bookmark", rec.Bookmark)
	}
	if info, _ := runInfo(p, first); info.State != "parked" {
		t.Errorf("the first runA is %+v, want parked", info)
	}
	commit(t, e, p, "ckpt-1", false)
	if n := e.Owner.Count(drivertest.CallSeed, queued); n != 0 {
		t.Errorf("the queued runA seeded during the checkpoint")
	}
	resume(t, p, "ckpt-1")

	ra := runA.MustSucceed(t)
	rb := hb.MustSucceed(t)
	if len(ra.Launches) != 1 || ra.Launches[0].Pauses != 1 {
		t.Errorf("first run's launches %+v: want one, paused once", ra.Launches)
	}
	if len(rb.Launches) != 1 || rb.Launches[0].Pauses != 0 {
		t.Errorf("queued run's launches %+v: want one, never paused", rb.Launches)
	}
	checkVerified(t, e, first, ra)
	checkVerified(t, e, queued, rb)
}

// TestParkBeforeLaunch proves that a checkpoint that opens before the
// harness is launched holds the launch until the checkpoint opens: the run
// is exported at the bookmark recorded before its step (seed, while the
// owner's seed is held), then parks before launching (no launch folder, no
// `ngsup run`, nothing running in the sandbox while parked), and launches
// once after the resume: one launch, never paused, verified.
func TestParkBeforeLaunch(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	ro := e.Rollout("before-launch")
	entered, release := make(chan struct{}), make(chan struct{})
	e.Owner.BeforeSeed(func(ctx context.Context, rollout string) error {
		close(entered)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	h := e.Start(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil))
	await(t, entered, "the seed", h)
	res := prepare(t, p, "ckpt-1")
	if _, bm := bookmarkOf(t, res.Records, ro); bm.Next != driver.StageSeed {
		t.Errorf("the run in its seed step was exported at %s, want seed", bm.Next)
	}
	close(release)
	testkit.Eventually(t, "the run parks before launching", func() (bool, string) {
		info, _ := runInfo(p, ro)
		return info.State == "parked", "state " + info.State
	})
	sbID := e.Session(ro).SandboxID
	if _, err := os.Stat(filepath.Join(e.HostPath(sbID), ".ngharness", "launches")); !os.IsNotExist(err) {
		t.Errorf("a launch folder exists while the run is parked before launching (%v)", err)
	}
	if n := len(e.Backend.Verbs("run")); n != 0 {
		t.Errorf("ngsup run ran %d times while parked before launching", n)
	}
	if pids := e.ProcsIn(sbID); len(pids) != 0 {
		t.Errorf("processes run in the sandbox while parked before launching: %v", pids)
	}
	resume(t, p, "ckpt-1")
	r := h.MustSucceed(t)
	if len(r.Launches) != 1 {
		t.Fatalf("want one launch, got %+v", r.Launches)
	}
	drivertest.CheckLaunch(t, r.Launches[0], driver.OutcomeFinished, 0, false)
	checkVerified(t, e, ro, r)
}

// TestParticipantRejectsCallsOutOfOrder proves the protocol errors through
// the participant's control plane, as Gym's control.py answers them: a
// commit with no checkpoint open is invalid_phase, a resume then is
// idempotent; while c1 is prepared, a prepare, commit or restore of c2 is
// checkpoint_conflict and a restore of c1 invalid_phase; after the resume,
// c1 is stale. A second run of a rollout in flight fails with
// ErrDuplicateRun; a run without a rollout id or with a body that is not a
// JSON object fails with ErrBadRequest; after Close, runs fail with
// ErrShuttingDown. None of them touches the owner.
func TestParticipantRejectsCallsOutOfOrder(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	p := drivertest.NewParticipant()
	c := p.Control()
	rn := e.Runner(drivertest.Fake(steps, stepS), p)
	dir := t.TempDir()
	if _, err := c.Commit(ctx, &gym.CommitRequest{Request: request("c"), CheckpointDir: dir}); !errors.Is(err, gym.ErrInvalidPhase) {
		t.Errorf("commit in idle: %v", err)
	}
	if rep, err := c.Resume(ctx, request("c0")); err != nil || !rep.Idempotent {
		t.Errorf("resume in idle: %+v, %v; want idempotent", rep, err)
	}
	prepare(t, p, "c1")
	if _, err := c.Prepare(ctx, request("c2")); !errors.Is(err, gym.ErrCheckpointConflict) {
		t.Errorf("prepare while prepared: %v", err)
	}
	if _, err := c.Commit(ctx, &gym.CommitRequest{Request: request("c2"), CheckpointDir: dir}); !errors.Is(err, gym.ErrCheckpointConflict) {
		t.Errorf("commit of another checkpoint: %v", err)
	}
	if _, err := c.Restore(ctx, &gym.RestoreRequest{Request: request("c1"), CheckpointDir: dir}); !errors.Is(err, gym.ErrInvalidPhase) {
		t.Errorf("restore while prepared: %v", err)
	}
	resume(t, p, "c1")
	if ph := c.Status().Phase; ph != gym.PhaseIdle {
		t.Errorf("phase %s after resume, want idle", ph)
	}
	if _, err := c.Prepare(ctx, request("c1")); !errors.Is(err, gym.ErrStaleCheckpoint) {
		t.Errorf("prepare of a resumed id: %v", err)
	}

	if _, err := rn.Run(ctx, driver.RunRequest{Body: json.RawMessage(`{}`)}); !errors.Is(err, driver.ErrBadRequest) {
		t.Errorf("a run without a rollout id: %v", err)
	}
	if _, err := rn.Run(ctx, driver.RunRequest{RolloutID: "x", Body: json.RawMessage(`[1]`)}); !errors.Is(err, driver.ErrBadRequest) {
		t.Errorf("a run whose body is not an object: %v", err)
	}

	ro := e.Rollout("dup")
	entered, release := make(chan struct{}), make(chan struct{})
	e.Owner.BeforeSeed(func(ctx context.Context, rollout string) error {
		close(entered)
		select {
		case <-release:
			return errors.New("seed refused by the test")
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	h := e.Start(rn, ro, 1, drivertest.Task(ro, steps, stepS, nil))
	await(t, entered, "the seed", h)
	if _, err := rn.Run(ctx, driver.RunRequest{RolloutID: ro, Attempt: 1, Body: drivertest.Task(ro, steps, stepS, nil)}); !errors.Is(err, driver.ErrDuplicateRun) {
		t.Errorf("a second run of a rollout in flight: %v", err)
	}
	close(release)
	if _, err := h.Wait(t); err == nil {
		t.Errorf("the run whose seed was refused succeeded")
	}
	p.Close()
	if _, err := rn.Run(ctx, driver.RunRequest{RolloutID: e.Rollout("late"), Body: json.RawMessage(`{}`)}); !errors.Is(err, driver.ErrShuttingDown) {
		t.Errorf("a run after Close: %v", err)
	}
	for _, c := range e.Owner.Calls("") {
		if c.Method != drivertest.CallSeed {
			t.Errorf("the owner was called: %+v", c)
		}
	}
}

// TestRestoredRecordsCarriedUntilClaimed proves that a checkpoint taken
// after a restore, before the rollouts are posted again, exports the
// restored records unchanged (same attempt, same bookmark), so a second
// crash loses none of them; that a record claimed by its run is no longer
// exported as restored; and that a driver restored from that second
// checkpoint continues the rollout from the first one's bookmark.
func TestRestoredRecordsCarriedUntilClaimed(t *testing.T) {
	t.Parallel()
	e := drivertest.New(t)
	ctx := context.Background()
	back, late := e.Rollout("back"), e.Rollout("late")
	stored := json.RawMessage(`{"reward":1,"stored":"late"}`)
	recs := []record{
		{RolloutID: back, Attempt: 1, Bookmark: json.RawMessage(`{"v":1,"next":"seed"}`)},
		{RolloutID: late, Attempt: 3, Bookmark: json.RawMessage(`{"v":1,"next":"return","result":{"reward":1,"stored":"late"}}`)},
	}
	p := drivertest.NewParticipant()
	rn := e.Runner(drivertest.Fake(3, 0.1), p)
	if err := restoreRecords(t, p, recs); err != nil {
		t.Fatal(err)
	}

	// A checkpoint before any rollout came back: both records, as the
	// attempts that continue them (Gym's restored sessions), bookmarks
	// unchanged.
	res := prepare(t, p, "ckpt-2")
	if len(res.Records) != 2 {
		t.Fatalf("ckpt-2 exported %d records, want the 2 restored: %+v", len(res.Records), res.Records)
	}
	for i, rec := range res.Records {
		if rec.RolloutID != recs[i].RolloutID || rec.Attempt != recs[i].Attempt+1 || string(rec.Bookmark) != string(recs[i].Bookmark) {
			t.Errorf("ckpt-2 exported %s attempt %d %s, want %s attempt %d %s", rec.RolloutID, rec.Attempt, rec.Bookmark, recs[i].RolloutID, recs[i].Attempt+1, recs[i].Bookmark)
		}
	}
	commit(t, e, p, "ckpt-2", false)
	resume(t, p, "ckpt-2")

	// One rollout comes back and finishes: only the other is carried on.
	checkVerified(t, e, back, e.Start(rn, back, 2, drivertest.Task(back, 3, 0.1, nil)).MustSucceed(t))
	res = prepare(t, p, "ckpt-3")
	if len(res.Records) != 1 || res.Records[0].RolloutID != late || res.Records[0].Attempt != 4 || string(res.Records[0].Bookmark) != string(recs[1].Bookmark) {
		t.Fatalf("ckpt-3 exported %+v, want only %s's restored record", res.Records, late)
	}
	ck3 := commit(t, e, p, "ckpt-3", false)
	resume(t, p, "ckpt-3")

	// A second crash: the driver restored from ckpt-3 returns the stored
	// result of the first restore's bookmark, without seeding.
	p2 := drivertest.NewParticipant()
	rn2 := e.Runner(drivertest.Fake(3, 0.1), p2)
	restore(t, e, p2, "ckpt-3", ck3)
	out, err := rn2.Run(ctx, driver.RunRequest{RolloutID: late, Attempt: 5, Body: drivertest.Task(late, 3, 0.1, nil)})
	if err != nil {
		t.Fatalf("the run restored twice: %v", err)
	}
	var got, want any
	if json.Unmarshal(out, &got) != nil || json.Unmarshal(stored, &want) != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("the run restored twice returned %s, want the stored result %s", out, stored)
	}
	if n := e.Owner.Count(drivertest.CallSeed, late); n != 0 {
		t.Errorf("the run restored twice seeded %d times", n)
	}
	if runs := p2.Runs(); len(runs) != 0 {
		t.Errorf("runs still registered: %+v", runs)
	}
}
