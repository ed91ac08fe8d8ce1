package harnesstest

import (
	"errors"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/pkg/proto"
)

// Crash is what CrashAfterSnapshot leaves: the sandbox attempt 1 ran in,
// the fork the restore made, the snapshot, the committed records, the
// model requests of attempt 1 and the processes of its launch at the
// checkpoint.
type Crash struct {
	// Old is the sandbox attempt 1 ran in; Fork the one the restore made.
	Old, Fork string
	// Snapshot is the owner's snapshot of Old.
	Snapshot string
	// Committed is what the checkpoint wrote.
	Committed Committed
	// Attempt1 are the model requests of attempt 1.
	Attempt1 []fakemodel.Request
	// OldProcs are the processes of attempt 1's launch at the checkpoint.
	OldProcs []proto.TreeProc
}

// CrashAfterSnapshot runs attempt 1 with a on p1 until ready (the moment
// to checkpoint), checkpoints it ("ck-1": pause, the owner's snapshot,
// commit, continue), lets it go on until the runner continued it and
// lasts returned (the same state still lasts), then crashes the driver
// (the run is cancelled with driver.ErrCrashed: nothing is cleaned up).
// The owner restores the checkpoint: it stops every launch of the old
// sandbox and forks the snapshot under a new sandbox id. The test fails
// unless there is one snapshot and one record, the record continues the
// paused launch, the restore forked, and no process of the crashed launch
// survived.
func (w *World) CrashAfterSnapshot(a harness.Adapter, p1 *driver.Participant, ready, lasts func(sandboxID, launchID string)) Crash {
	t := w.T
	t.Helper()
	var c Crash
	h1 := w.Start(w.Runner(a, p1), 1)
	c.Old = w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, c.Old)
	ready(c.Old, l1)

	w.Prepare(p1, "ck-1")
	tr, err := w.Suite.Tree(w.LaunchDir(c.Old, l1))
	if err != nil {
		t.Fatal(err)
	}
	c.OldProcs = tr.Processes
	snaps, ck := w.Commit(p1, "ck-1")
	if len(snaps) != 1 || len(ck.Records) != 1 {
		t.Fatalf("checkpoint ck-1: snapshots %v, records %d; want one of each", snaps, len(ck.Records))
	}
	for _, s := range snaps {
		c.Snapshot = s
	}
	c.Committed = ck
	_, bm, err := driver.ParseAgentRecord(ck.Records[0])
	if err != nil || bm.Next != driver.StageHarness || !bm.Resume || bm.Paused == nil || bm.Paused.ID != l1 {
		t.Fatalf("the committed bookmark (%v) does not continue the paused launch %s: %s", err, l1, ck.Records[0].JSON)
	}
	w.Resume(p1, "ck-1")
	// The run continues its launch once the checkpoint opens: crash only
	// after that, as the same state still lasts.
	w.WaitContinued(1)
	lasts(c.Old, l1)

	h1.Cancel(driver.ErrCrashed)
	if _, err := w.Wait(h1); !errors.Is(err, driver.ErrCrashed) {
		t.Fatalf("attempt 1 returned %v, want the crash", err)
	}
	c.Attempt1 = ByAttempt(w.Model.Requests(), 1)

	w.RestoreOwner("ck-1", c.Committed)
	c.Fork = w.WaitSandbox(2)
	if c.Fork == c.Old {
		t.Fatalf("the restore did not fork: sandboxes %v", w.Sandboxes())
	}
	for _, p := range c.OldProcs {
		if proctest.Same(p.PID, p.StartTicks) {
			t.Errorf("process %d (%s) of the crashed launch survived the restore", p.PID, p.Comm)
		}
	}
	return c
}

// CheckRelaunch checks the launch log of the attempt after the crash c:
// two launches, the first (launch 1 of attempt 1) in the old sandbox,
// interrupted by the crash after its one pause, the second (launch 2, of
// attempt 2) in the fork, supervised, finished with exit code 0. What the
// second's resume decision was is the caller's to check.
func (w *World) CheckRelaunch(launches []driver.LaunchRecord, c Crash) {
	t := w.T
	t.Helper()
	if len(launches) != 2 {
		t.Fatalf("%d launches, want 2: %+v", len(launches), launches)
	}
	l1, l2 := launches[0], launches[1]
	if l1.ID != w.LaunchID(1, 1, c.Old) || l1.SandboxID != c.Old || l1.Outcome != driver.OutcomeInterrupted || l1.Pauses != 1 {
		t.Errorf("launch 1: %+v; want %s in %s, interrupted (the crash), pauses 1", l1, w.LaunchID(1, 1, c.Old), c.Old)
	}
	if l2.ID != w.LaunchID(2, 2, c.Fork) || l2.SandboxID != c.Fork || l2.Outcome != driver.OutcomeFinished || l2.ExitCode != 0 || !l2.Supervised {
		t.Errorf("launch 2: %+v; want %s in the fork %s, finished, exit code 0, supervised", l2, w.LaunchID(2, 2, c.Fork), c.Fork)
	}
}
