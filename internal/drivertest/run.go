package drivertest

import (
	"encoding/json"
	"testing"

	"github.com/ngharness/ngharness/pkg/driver"
)

// Until says how far WaitRunning waits for a run of the fake harness
// beyond its seed and its session folder (which it always waits for).
type Until struct {
	// Steps is how many steps the session must hold; 0 waits for none.
	Steps int
	// Kinds are the process kinds the session's pids file must list (see
	// WaitPids); none waits for no pids file and leaves Run.Procs empty.
	Kinds []string
}

// Run is a run of the fake harness seen running: its handle and what the
// driver's tests follow it by.
type Run struct {
	*Handle
	// SandboxID is the sandbox the owner lent the rollout at its first seed.
	SandboxID string
	// Session is the host folder of the harness's fake session.
	Session string
	// Procs are the processes the harness recorded, of Until.Kinds.
	Procs []Proc
}

// WaitRunning waits until the run h has its harness running as far as u
// says: the rollout's first seed (so it is meant for a rollout's first
// seed in this Env), its fake session in the lent sandbox, then u's pids
// and steps. It returns what it saw.
func (e *Env) WaitRunning(h *Handle, u Until) *Run {
	e.T.Helper()
	r := &Run{Handle: h}
	r.SandboxID = e.WaitSeeded(h.Rollout, 1).SandboxID
	r.Session = e.WaitSession(r.SandboxID, h.Rollout)
	if len(u.Kinds) > 0 {
		r.Procs = e.WaitPids(r.Session, u.Kinds...)
	}
	if u.Steps > 0 {
		e.WaitSteps(r.Session, u.Steps)
	}
	return r
}

// StartRunning is Start then WaitRunning: the repeated opening of a driver
// test that starts a run of the fake harness and acts once it runs.
func (e *Env) StartRunning(rn *driver.Runner, rollout string, attempt int, body json.RawMessage, u Until) *Run {
	e.T.Helper()
	return e.WaitRunning(e.Start(rn, rollout, attempt, body), u)
}

// NewParticipant is a participant for the fake adapter, with no limit on
// the runs in flight (maxRuns[0] when given).
func NewParticipant(maxRuns ...int) *driver.Participant {
	cfg := driver.ParticipantConfig{Adapter: "fake"}
	if len(maxRuns) > 0 {
		cfg.MaxRuns = maxRuns[0]
	}
	return driver.MustParticipant(cfg)
}

// CheckLaunch checks one launch record's outcome, pauses and resumption.
func CheckLaunch(t testing.TB, l driver.LaunchRecord, outcome driver.Outcome, pauses int, resumed bool) {
	t.Helper()
	if l.Outcome != outcome || l.Pauses != pauses || l.Resumed != resumed {
		t.Errorf("launch %s: outcome %s pauses %d resumed %v (reason %q, error %q); want outcome %s pauses %d resumed %v",
			l.ID, l.Outcome, l.Pauses, l.Resumed, l.Reason, l.Error, outcome, pauses, resumed)
	}
}
