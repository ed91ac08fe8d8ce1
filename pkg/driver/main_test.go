package driver_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/internal/drivertest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// The driver's tests run real processes through the real ngsup: TestMain
// builds the static ngsup once, and each test gets a local backend, a local
// owner and the fake adapter (drivertest.New).
func TestMain(m *testing.M) { drivertest.Main(m) }

// Timings of the fake harness in these tests.
const (
	steps = 8
	stepS = 0.25
)

// prepare opens a checkpoint and requires every run to be parked.
func prepare(t *testing.T, p *driver.Participant, id string) driver.PrepareResult {
	t.Helper()
	res, err := p.Prepare(context.Background(), id, time.Now().Add(drivertest.Patience))
	if err != nil {
		t.Fatalf("prepare %s: %v", id, err)
	}
	if !res.Parked {
		t.Fatalf("prepare %s: runs not parked: %v", id, res.NotParked)
	}
	return res
}

// resume opens the checkpoint.
func resume(t *testing.T, p *driver.Participant, id string) {
	t.Helper()
	if err := p.Resume(id); err != nil {
		t.Fatalf("resume %s: %v", id, err)
	}
}

// commit snapshots every open session (the owner's side) and commits.
func commit(t *testing.T, e *drivertest.Env, p *driver.Participant, id string, stop bool) []driver.Record {
	t.Helper()
	if _, err := e.Owner.Snapshot(context.Background(), id); err != nil {
		t.Fatalf("snapshot %s: %v", id, err)
	}
	recs, err := p.Commit(context.Background(), id, stop)
	if err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	return recs
}

// bookmarkOf returns the parsed bookmark of rollout's record; the test fails
// if there is none.
func bookmarkOf(t *testing.T, recs []driver.Record, rollout string) (driver.Record, driver.Bookmark) {
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
	return driver.Record{}, driver.Bookmark{}
}

// hasRecord reports whether recs hold a record of rollout.
func hasRecord(recs []driver.Record, rollout string) bool {
	return slices.ContainsFunc(recs, func(r driver.Record) bool { return r.RolloutID == rollout })
}

// checkLaunch checks one launch record's outcome, pauses and resumption.
func checkLaunch(t *testing.T, l driver.LaunchRecord, outcome driver.Outcome, pauses int, resumed bool) {
	t.Helper()
	if l.Outcome != outcome || l.Pauses != pauses || l.Resumed != resumed {
		t.Errorf("launch %s: outcome %s pauses %d resumed %v (reason %q, error %q); want outcome %s pauses %d resumed %v",
			l.ID, l.Outcome, l.Pauses, l.Resumed, l.Reason, l.Error, outcome, pauses, resumed)
	}
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
