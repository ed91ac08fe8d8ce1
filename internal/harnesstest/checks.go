package harnesstest

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// Hold is how long a checkpoint in these tests keeps a launch paused
// between two looks at it: long enough for anything that could move to
// move.
const Hold = 3 * time.Second

// DescribeRequest is one line about a model request, for logs.
func DescribeRequest(r fakemodel.Request) string {
	last := r.LastMessage()
	content := last.Content
	if len(content) > 80 {
		content = content[:80] + "..."
	}
	return fmt.Sprintf("%s tools=%t messages=%d last=%s %q", r.Path, r.HasTools, len(r.Messages), last.Role, content)
}

// ByAttempt keeps the requests of one attempt (the /ng-rollout/<id>-a<n>
// prefix the adapter gives the harness's provider).
func ByAttempt(reqs []fakemodel.Request, attempt int) []fakemodel.Request {
	var out []fakemodel.Request
	for _, r := range reqs {
		if r.Attempt == attempt {
			out = append(out, r)
		}
	}
	return out
}

// DescribeSessions lists a tree's processes with their process groups and
// sessions (comm pid/ppid/pgid/sid).
func DescribeSessions(tr proto.TreeResult) string {
	var parts []string
	for _, p := range tr.Processes {
		parts = append(parts, fmt.Sprintf("%s %d/%d/%d/%d", p.Comm, p.PID, p.PPID, p.PGID, p.SID))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// CheckOneLaunch checks the launch log of a run that paused in place only:
// one launch, not resumed, finished, paused pauses times.
func (w *World) CheckOneLaunch(launches []driver.LaunchRecord, pauses int) {
	t := w.T
	t.Helper()
	w.Obs.mu.Lock()
	if w.Obs.pauses != pauses || w.Obs.continues != pauses || w.Obs.ends != 1 {
		t.Errorf("the runner reported %d confirmed pauses, %d continues, %d launch ends; want %d, %d, 1", w.Obs.pauses, w.Obs.continues, w.Obs.ends, pauses, pauses)
	}
	w.Obs.mu.Unlock()
	if len(launches) != 1 {
		t.Fatalf("%d launches, want 1: %+v", len(launches), launches)
	}
	l := launches[0]
	if l.Outcome != driver.OutcomeFinished || l.Pauses != pauses || l.Resumed || !l.Supervised || l.ExitCode != 0 {
		t.Errorf("launch %s: outcome %s, pauses %d, resumed %v, supervised %v, exit code %d (error %q); want finished, %d, false, true, 0",
			l.ID, l.Outcome, l.Pauses, l.Resumed, l.Supervised, l.ExitCode, l.Error, pauses)
	}
}

// Harness is the launch's harness process, read from its receipt. The
// test fails unless its executable is the world's harness binary (the
// adapter runs it with no shell left in between).
func (w *World) Harness(sandboxID, launchID string) proto.Proc {
	w.T.Helper()
	r := w.Receipt(sandboxID, launchID)
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", r.HarnessPID))
	if err != nil || exe != w.harnessBin {
		w.T.Fatalf("the harness %d of launch %s runs %q (%v), want %s %s", r.HarnessPID, launchID, exe, err, w.harness, w.harnessBin)
	}
	return proto.Proc{PID: r.HarnessPID, StartTicks: r.HarnessStartTicks}
}

// CheckSameHarnessFinished checks that the launch's receipt says the
// harness hp (the harness process seen paused) is the one that ran to the
// end and exited 0.
func (w *World) CheckSameHarnessFinished(sandboxID, launchID string, hp proto.Proc) {
	w.T.Helper()
	r := w.Receipt(sandboxID, launchID)
	if r.HarnessPID != hp.PID || r.HarnessStartTicks != hp.StartTicks || !r.Ended || r.ExitCode != 0 || r.Signal != 0 {
		w.T.Errorf("receipt of %s: harness %d (start %d), ended %v, exit code %d, signal %d; want the paused %s %d (start %d), ended, 0",
			launchID, r.HarnessPID, r.HarnessStartTicks, r.Ended, r.ExitCode, r.Signal, w.harness, hp.PID, hp.StartTicks)
	}
}
