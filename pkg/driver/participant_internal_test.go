package driver

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestRestoreNamesAtMostTenLiveRuns proves that a restore refused under
// live runs names them, but never more than ten: the rest are counted.
func TestRestoreNamesAtMostTenLiveRuns(t *testing.T) {
	p := NewParticipant(0)
	for i := range 25 {
		if _, err := p.register(fmt.Sprintf("live-%02d", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	err := p.Restore("ck", nil)
	if !errors.Is(err, ErrRunsInFlight) {
		t.Fatalf("restore under 25 live runs: %v, want ErrRunsInFlight", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "live-00") || !strings.Contains(msg, "live-09") || strings.Contains(msg, "live-10") || !strings.Contains(msg, "and 15 more") {
		t.Errorf("the error %q should name the first ten runs and count the other 15", msg)
	}
	if p.Phase() != PhaseIdle {
		t.Errorf("a refused restore moved the phase to %s", p.Phase())
	}
}
