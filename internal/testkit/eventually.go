package testkit

import (
	"testing"
	"time"
)

// Patience bounds every wait of a test on something that should happen:
// generous, never an assertion about speed. A package whose waits are all
// short (a fake server in process, a static binary on this machine) sets
// its own once, in TestMain before the tests run, so that a broken build
// fails in seconds rather than minutes; it is read-only after that.
var Patience = 3 * time.Minute

// Eventually polls cond until it says true; once Patience has passed, the
// test fails naming what it waited for and the last reason cond gave (its
// second result, which says what it saw). cond runs on the test's
// goroutine, first at once, then at growing intervals up to 100 ms.
func Eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	limit := Patience
	deadline := time.Now().Add(limit)
	wait := 5 * time.Millisecond
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if why == "" {
				t.Fatalf("%s: not within %s", what, limit)
			}
			t.Fatalf("%s: not within %s: %s", what, limit, why)
		}
		time.Sleep(wait)
		wait = min(wait*2, 100*time.Millisecond)
	}
}
