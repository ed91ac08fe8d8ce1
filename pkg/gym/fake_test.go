package gym

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// fake is a participant for the control plane's tests: its readiness,
// records and failures are set by the test, and it records every call.
type fake struct {
	mu        sync.Mutex
	kind      string
	open      bool
	blockers  []string
	restarts  []string
	records   []Record
	installed []Record
	scopes    [][]EpisodeID
	retired   []EpisodeID
	parked    []Record
	parkedAt  []bool // whether the manifest was on disk when ParkExported ran
	pending   []EpisodeID
	deleted   []EpisodeID
	exports   int
	closeErr  error
	retireErr error
	install   func(context.Context) error
	manifest  func() bool
	onExport  func([]Record)
	c         *Control
}

func newFake(t *testing.T, grace time.Duration) (*fake, *Control) {
	t.Helper()
	f := &fake{kind: "agent", open: true}
	c, err := NewControl(f, Config{Instance: "inst", LeaseGrace: grace, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	return f, c
}

func (f *fake) Kind() string { return f.kind }

func (f *fake) CloseAdmission(ctx context.Context, req Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open = false
	if err := f.closeErr; err != nil {
		f.closeErr = nil
		return err
	}
	return nil
}

func (f *fake) OpenAdmission(ctx context.Context) error {
	f.mu.Lock()
	f.open = true
	f.mu.Unlock()
	return nil
}

func (f *fake) isOpen() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.open
}

func (f *fake) Readiness() Report {
	f.mu.Lock()
	defer f.mu.Unlock()
	return NewReport(len(f.blockers) == 0, f.blockers, map[string]int{"sessions": len(f.records)}, slices.Clone(f.restarts))
}

// setBlockers changes readiness and tells the control plane, as a real
// participant does when a run reaches a boundary.
func (f *fake) setBlockers(keys ...string) {
	f.mu.Lock()
	f.blockers = keys
	f.mu.Unlock()
	f.c.Notify()
}

func (f *fake) Export(ctx context.Context, scope []EpisodeID) ([]Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exports++
	var out []Record
	for _, r := range f.records {
		// A participant never exports an attempt it refuses.
		if (scope == nil || slices.Contains(scope, r.EpisodeID)) && f.c.CheckAttempt(r.EpisodeID) == nil {
			out = append(out, r)
		}
	}
	if f.onExport != nil {
		f.onExport(out)
	}
	return out, nil
}

func (f *fake) Install(ctx context.Context, records []Record, scope []EpisodeID) error {
	if f.install != nil {
		if err := f.install(ctx); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.installed = append(f.installed, records...)
	f.scopes = append(f.scopes, scope)
	for _, r := range records {
		f.pending = append(f.pending, r.EpisodeID.Next())
	}
	return nil
}

func (f *fake) Retire(ctx context.Context, id EpisodeID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.retireErr != nil {
		return f.retireErr
	}
	f.retired = append(f.retired, id)
	f.records = slices.DeleteFunc(f.records, func(r Record) bool {
		return r.EpisodeID.RolloutID == id.RolloutID && r.EpisodeID.Attempt <= id.Attempt
	})
	return nil
}

func (f *fake) ParkExported(ctx context.Context, records []Record) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parked = append(f.parked, records...)
	if f.manifest != nil {
		f.parkedAt = append(f.parkedAt, f.manifest())
	}
	return nil
}

func (f *fake) RestoredPending(ctx context.Context) ([]EpisodeID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pending), nil
}

func (f *fake) DeleteRestored(ctx context.Context, id EpisodeID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, id)
	f.pending = slices.DeleteFunc(f.pending, func(p EpisodeID) bool { return p == id })
	return nil
}

func (f *fake) StatusExtra() map[string]any {
	return map[string]any{"accepting": f.isOpen()}
}

// rec builds a record of episode (rollout, attempt) carrying a step.
func rec(t *testing.T, rollout string, attempt, step int) Record {
	t.Helper()
	r, err := NewRecord(map[string]any{"episode_id": EpisodeID{rollout, attempt}, "episode": map[string]int{"step": step}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// in returns a control request whose deadline is secs from now.
func in(id string, secs float64) Request {
	return Request{CheckpointID: id, DeadlineTS: nowSeconds() + secs}
}

// wantCode fails unless err classifies as code.
func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s", code)
	}
	if _, got := Classify(err); got != code {
		t.Fatalf("got %s (%v), want %s", got, err, code)
	}
}

// must returns v, or panics with err: a test helper for calls whose
// results go straight into an expression (a panic fails the test with the
// error and its stack).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

var errBoom = errors.New("boom")
