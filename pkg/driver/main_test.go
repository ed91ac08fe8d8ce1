package driver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/drivertest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/gym"
)

// The driver's tests run real processes through the real ngsup: TestMain
// builds the static ngsup once, and each test gets a local backend, a local
// owner and the fake adapter (drivertest.New).
func TestMain(m *testing.M) { drivertest.Main(m) }

// Timings of the fake harness in these tests.
const (
	steps = 8
	stepS = 0.25
	// endlessSteps is the length of a run a test ends itself (cancels,
	// or kills its supervisor): ten minutes of steps, so that its harness
	// is still running when the test acts however slowly the machine
	// reached that point. A run of a few seconds could finish first on a
	// loaded machine, and the test would then check a launch that ended
	// by itself.
	endlessSteps = 2400
)

// record is one exported run, as the tests read it back.
type record struct {
	RolloutID string
	Attempt   int
	Bookmark  json.RawMessage // the whole bookmark, the adapter's state in it
}

func toRecords(t *testing.T, recs []gym.Record) []record {
	t.Helper()
	out := make([]record, 0, len(recs))
	for _, r := range recs {
		_, b, err := driver.ParseAgentRecord(r)
		if err != nil {
			t.Fatalf("an exported record does not parse: %v\n%s", err, r.JSON)
		}
		data, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, record{RolloutID: r.EpisodeID.RolloutID, Attempt: r.EpisodeID.Attempt, Bookmark: data})
	}
	return out
}

func request(id string) gym.Request {
	return gym.Request{CheckpointID: id, DeadlineTS: float64(time.Now().Add(drivertest.Patience).UnixNano()) / 1e9}
}

// prepared is what a prepare left: the records a commit would write now.
type prepared struct{ Records []record }

// prepare opens a checkpoint and requires every run to be parked; it
// returns what the participant would export at once.
func prepare(t *testing.T, p *driver.Participant, id string) prepared {
	t.Helper()
	rep, err := p.Control().Prepare(context.Background(), request(id))
	if err != nil {
		t.Fatalf("prepare %s: %v", id, err)
	}
	if rep.Phase != gym.PhasePrepared {
		t.Fatalf("prepare %s: runs not parked: %v", id, rep.Report.Blockers)
	}
	recs, err := p.Export(context.Background(), nil)
	if err != nil {
		t.Fatalf("export %s: %v", id, err)
	}
	return prepared{Records: toRecords(t, recs)}
}

// resume opens the checkpoint.
func resume(t *testing.T, p *driver.Participant, id string) {
	t.Helper()
	if _, err := p.Control().Resume(context.Background(), request(id)); err != nil {
		t.Fatalf("resume %s: %v", id, err)
	}
}

// commit snapshots every open session (the owner's side) and commits into
// the Env's folder for id, then reads the records back from disk.
func commit(t *testing.T, e *drivertest.Env, p *driver.Participant, id string, stop bool) []record {
	t.Helper()
	// The owner's side: it snapshots every open session. Its own stop is
	// the owner's tests' (a stop here is the driver's).
	oc := e.OwnerControl
	if rep, err := oc.Prepare(context.Background(), request(id)); err != nil || rep.Phase != gym.PhasePrepared {
		t.Fatalf("prepare the owner for %s: %+v, %v", id, rep, err)
	}
	if _, err := oc.Commit(context.Background(), &gym.CommitRequest{Request: request(id), CheckpointDir: e.CheckpointDir(id)}); err != nil {
		t.Fatalf("commit the owner's %s: %v", id, err)
	}
	if _, err := oc.Resume(context.Background(), request(id)); err != nil {
		t.Fatalf("resume the owner after %s: %v", id, err)
	}
	if _, err := p.Control().Commit(context.Background(), &gym.CommitRequest{Request: request(id), CheckpointDir: e.CheckpointDir(id), Stop: stop}); err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	var recs []gym.Record
	if _, err := gym.ReadState(e.CheckpointDir(id), gym.KindAgent, driver.DefaultInstance, func(r gym.Record) error {
		recs = append(recs, r)
		return nil
	}); err != nil {
		t.Fatalf("read back checkpoint %s: %v", id, err)
	}
	return toRecords(t, recs)
}

// restoreOwner restores the owner's records of checkpoint id for recs'
// episodes (each session forked into a new sandbox for the next attempt)
// and resumes it, as the controller does after a crash.
func restoreOwner(t *testing.T, e *drivertest.Env, id string, recs []record) {
	t.Helper()
	scope := make([]gym.EpisodeID, len(recs))
	for i, r := range recs {
		scope[i] = gym.EpisodeID{RolloutID: r.RolloutID, Attempt: r.Attempt}
	}
	ctx := context.Background()
	if _, err := e.OwnerControl.Restore(ctx, &gym.RestoreRequest{Request: request("restore-" + id), CheckpointDir: e.CheckpointDir(id), EpisodeIDs: scope}); err != nil {
		t.Fatalf("restore the owner from %s: %v", id, err)
	}
	if _, err := e.OwnerControl.Resume(ctx, request("restore-"+id)); err != nil {
		t.Fatalf("resume the owner after restoring %s: %v", id, err)
	}
}

// restore installs the committed checkpoint id into p (every record, each
// under its next attempt) and resumes, as the controller does after a
// crash.
func restore(t *testing.T, e *drivertest.Env, p *driver.Participant, id string, recs []record) {
	t.Helper()
	if err := restoreFrom(p, e.CheckpointDir(id), id, recs); err != nil {
		t.Fatalf("restore %s: %v", id, err)
	}
}

func restoreFrom(p *driver.Participant, dir, id string, recs []record) error {
	scope := make([]gym.EpisodeID, len(recs))
	for i, r := range recs {
		scope[i] = gym.EpisodeID{RolloutID: r.RolloutID, Attempt: r.Attempt}
	}
	ctx := context.Background()
	if _, err := p.Control().Restore(ctx, &gym.RestoreRequest{Request: request("restore-" + id), CheckpointDir: dir, EpisodeIDs: scope}); err != nil {
		return err
	}
	_, err := p.Control().Resume(ctx, request("restore-"+id))
	return err
}

// restoreRecords writes recs (bookmarks as given, valid or not) as a
// checkpoint of the fake adapter and restores it into p.
func restoreRecords(t *testing.T, p *driver.Participant, recs []record) error {
	t.Helper()
	dir := t.TempDir()
	stored := make([]gym.Record, 0, len(recs))
	for _, r := range recs {
		episode := r.Bookmark
		if !json.Valid(episode) {
			episode, _ = json.Marshal(string(r.Bookmark))
		}
		rec, err := gym.NewRecord(driver.AgentRecord{EpisodeID: gym.EpisodeID{RolloutID: r.RolloutID, Attempt: r.Attempt},
			SessionKey: r.RolloutID, Session: driver.AgentSession{Adapter: "fake"}, Boundary: json.RawMessage("null"), Episode: episode})
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, rec)
	}
	if _, err := gym.WriteState(dir, gym.KindAgent, driver.DefaultInstance, "ckpt-written", stored, nil, nil); err != nil {
		t.Fatal(err)
	}
	return restoreFrom(p, dir, "ckpt-written", recs)
}

// bookmarkOf returns the parsed bookmark of rollout's record; the test fails
// if there is none.
func bookmarkOf(t *testing.T, recs []record, rollout string) (record, driver.Bookmark) {
	t.Helper()
	for _, r := range recs {
		if r.RolloutID == rollout {
			b, err := driver.ParseBookmark(r.Bookmark)
			if err != nil {
				t.Fatalf("the record of %s holds a bookmark that does not parse: %v\n%s", rollout, err, r.Bookmark)
			}
			return r, b
		}
	}
	t.Fatalf("no record of %s among %d", rollout, len(recs))
	return record{}, driver.Bookmark{}
}

// hasRecord reports whether recs hold a record of rollout.
func hasRecord(recs []record, rollout string) bool {
	return slices.ContainsFunc(recs, func(r record) bool { return r.RolloutID == rollout })
}

// checkVerified checks that the run got reward 1 and the owner's session
// of the rollout is closed and verified.
func checkVerified(t *testing.T, e *drivertest.Env, rollout string, r drivertest.Result) {
	t.Helper()
	if r.Reward != 1 {
		t.Errorf("reward %v (failure %q), want 1; result %s", r.Reward, r.FailureKind, r.Raw)
	}
	s := e.Session(rollout)
	if !s.Closed || !s.Verified {
		t.Errorf("the owner's session of %s: closed %v verified %v, want both", rollout, s.Closed, s.Verified)
	}
}

// checkStates fails unless every process in procs is in one of states
// (gone counts as '-').
func checkStates(t *testing.T, what string, procs []drivertest.Proc, states string) {
	t.Helper()
	var bad []string
	for _, p := range procs {
		if s := p.State(); !strings.ContainsRune(states, rune(s)) {
			bad = append(bad, fmt.Sprintf("%s in state %c", p, s))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: want states %q: %v", what, states, bad)
	}
}

// checkHeld fails unless every process in procs is alive and held by the
// pause: stopped, or in an uninterruptible call with SIGSTOP pending (it
// stops when the call returns), as ngsup's pause confirms it.
func checkHeld(t *testing.T, what string, procs []drivertest.Proc) {
	t.Helper()
	var bad []string
	for _, p := range procs {
		if held, why := p.Held(); !held {
			bad = append(bad, fmt.Sprintf("%s in state %c: %s", p, p.State(), why))
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: want every process held: %v", what, bad)
	}
}

func boolp(b bool) *bool { return &b }

// Short names for the hooks' signatures.
type (
	sandboxT = sandbox.Sandbox
	execReq  = sandbox.ExecRequest
	execRes  = sandbox.ExecResult
)

func itoa(n int) string { return strconv.Itoa(n) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// await waits for ch to close, failing the test if the run h returns first
// or Patience passes.
func await(t *testing.T, ch <-chan struct{}, what string, h *drivertest.Handle) {
	t.Helper()
	select {
	case <-ch:
	case <-h.Done():
		_, err := h.Wait(t)
		t.Fatalf("the run returned (%v) before %s", err, what)
	case <-time.After(drivertest.Patience):
		t.Fatalf("%s: not within %s", what, drivertest.Patience)
	}
}
