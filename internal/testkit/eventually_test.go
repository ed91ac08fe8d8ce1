package testkit

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as the real one does.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runEventually runs Eventually on its own goroutine with rec, and returns
// whether it returned (rather than failed).
func runEventually(rec *recorder, what string, cond func() (bool, string)) bool {
	returned := make(chan bool, 1)
	go func() {
		defer func() { returned <- false }()
		Eventually(rec, what, cond)
		returned <- true
	}()
	return <-returned
}

// TestEventuallyReturnsOnceCondHolds: it asks again until cond says true,
// and returns then, without failing.
func TestEventuallyReturnsOnceCondHolds(t *testing.T) {
	n := 0
	rec := &recorder{TB: t}
	if !runEventually(rec, "the third look", func() (bool, string) {
		n++
		return n == 3, fmt.Sprintf("look %d", n)
	}) || rec.msg != "" || n != 3 {
		t.Fatalf("returned after %d looks, failure %q", n, rec.msg)
	}
}

// TestEventuallyFailsNamingWhatAndTheLastReason: past Patience the test
// fails with what it waited for, the bound and what cond said last.
func TestEventuallyFailsNamingWhatAndTheLastReason(t *testing.T) {
	defer func(p time.Duration) { Patience = p }(Patience)
	Patience = 50 * time.Millisecond
	n := 0
	rec := &recorder{TB: t}
	if runEventually(rec, "the door opens", func() (bool, string) {
		n++
		return false, fmt.Sprintf("closed at look %d", n)
	}) {
		t.Fatal("Eventually returned for a cond that never held")
	}
	want := fmt.Sprintf("the door opens: not within 50ms: closed at look %d", n)
	if rec.msg != want || n < 2 {
		t.Errorf("failure %q after %d looks, want %q", rec.msg, n, want)
	}
	rec = &recorder{TB: t}
	runEventually(rec, "silence", func() (bool, string) { return false, "" })
	if rec.msg != "silence: not within 50ms" {
		t.Errorf("failure without a reason: %q", rec.msg)
	}
}
