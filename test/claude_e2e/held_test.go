package claudee2e

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// TestClaudePauseHeldReply: a checkpoint pauses Claude Code while the model's
// reply to its first request is held. The reply is released while Claude Code
// is paused: its bytes wait unread in Claude Code's socket, and nothing in the
// sandbox (files, CPU times) changes. After the checkpoint opens Claude Code
// reads that reply, runs the tool call it holds and finishes: one launch,
// pauses 1, no model call repeated.
func TestClaudePauseHeldReply(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "held", fakemodel.Options{Script: script("echo start; sleep 1; touch done.txt", "touch done.txt")})
	w.Model.Hold(1)
	p := newParticipant()
	h := w.Start(w.Runner(w.adapter(nil), p), 1)
	w.WaitHeld(1)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	cx := w.Harness(sb, l1)
	port := w.ModelPort()

	a, base := w.PausedLook(p, "ck-1", sb, l1, port)
	queued := w.ReleaseSettled(port, base)
	time.Sleep(harnesstest.Hold)
	b := w.Observe(sb, l1)
	t.Logf("paused on the held reply, processes %v: %s", harnesstest.Comms(a), compareStill(t, a, b))
	if slices.Contains(harnesstest.Comms(b), "sleep") {
		t.Errorf("the tool ran while paused")
	}
	if q, err := harnesstest.RxQueued(port); err != nil || q != queued {
		t.Errorf("Claude Code's sockets held %d unread bytes from the model, then %d (%v): it read while paused", queued, q, err)
	}
	if n := len(w.Model.Requests()); n != 1 {
		t.Errorf("%d model requests while paused, want the 1 before it", n)
	}
	w.Resume(p, "ck-1")

	r := w.mustSucceed(h)
	w.CheckOneLaunch(r.Launches, 1)
	w.CheckSameHarnessFinished(sb, l1, cx)
	t.Logf("the reply (%d bytes) waited unread in Claude Code's socket while paused and was read after continue; %s",
		queued-base, w.checkOneToolRun(w.Model.Requests(), 1))
}

// TestClaudeCrashBeforeResponse: the driver crashes after a checkpoint
// taken while Claude Code's first model request is held (no completed response
// saved). The relaunch in the fork starts over (resumed false, the reason
// naming the missing response), makes its two model calls with the task
// the only user turn, and is verified.
func TestClaudeCrashBeforeResponse(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "noresp", fakemodel.Options{Script: script("touch done.txt", "touch done.txt")})
	w.Model.Hold(1)
	p1 := newParticipant()
	h1 := w.Start(w.Runner(w.adapter(nil), p1), 1)
	w.WaitHeld(1)
	old := w.WaitSandbox(1)
	w.Prepare(p1, "ck-1")
	_, ck := w.Commit(p1, "ck-1")
	w.Resume(p1, "ck-1")
	w.WaitContinued(1)
	if w.Model.Held() != 1 {
		t.Fatalf("the first request is no longer held")
	}
	h1.Cancel(driver.ErrCrashed)
	if _, err := w.Wait(h1); !errors.Is(err, driver.ErrCrashed) {
		t.Fatalf("attempt 1 returned %v, want the crash", err)
	}
	w.RestoreOwner("ck-1", ck)
	fork := w.WaitSandbox(2)

	p2 := newParticipant()
	w.Restore(p2, "ck-1", ck)
	h2 := w.Start(w.Runner(w.adapter(nil), p2), 2)
	r := w.mustSucceed(h2)
	w.Model.Release() // attempt 1's request, whose client is gone
	if len(r.Launches) != 2 {
		t.Fatalf("%d launches, want 2: %+v", len(r.Launches), r.Launches)
	}
	l1, l2 := r.Launches[0], r.Launches[1]
	if l1.SandboxID != old || l1.Outcome != driver.OutcomeInterrupted {
		t.Errorf("launch 1: %+v; want in %s, interrupted", l1, old)
	}
	if l2.SandboxID != fork || l2.Resumed || l2.Outcome != driver.OutcomeFinished ||
		!strings.Contains(l2.Reason, "holds no completed model response; starting over with the task in a fresh CLAUDE_CONFIG_DIR") {
		t.Errorf("launch 2: %+v; want in the fork %s, not resumed (no completed response), finished", l2, fork)
	}
	t.Logf("launch 2 reason %q; %s", l2.Reason, w.checkOneToolRun(harnesstest.ByAttempt(w.Model.Requests(), 2), 2))
}

// TestClaudeTwoRolloutsApart: two rollouts run Claude Code at once, each in its
// own sandbox. A checkpoint of one pauses its processes only: the other's
// Claude Code, tool and sleep keep running (none stopped) and it finishes while
// the first is held; then the first continues and finishes too.
func TestClaudeTwoRolloutsApart(t *testing.T) {
	t.Parallel()
	wa := newWorld(t, "twoa", fakemodel.Options{Script: script("echo start; sleep 6; touch done.txt", "touch done.txt")})
	wb := newWorld(t, "twob", fakemodel.Options{Script: script("echo start; sleep 3; touch done.txt", "touch done.txt")})
	pa, pb := newParticipant(), newParticipant()
	ha := wa.Start(wa.Runner(wa.adapter(nil), pa), 1)
	hb := wb.Start(wb.Runner(wb.adapter(nil), pb), 1)
	sa, sb := wa.WaitSandbox(1), wb.WaitSandbox(1)
	la, lb := wa.LaunchID(1, 1, sa), wb.LaunchID(1, 1, sb)
	wa.WaitProc(sa, la, "sleep")
	wb.WaitProc(sb, lb, "sleep")

	wa.Prepare(pa, "ck-a")
	a := wa.Observe(sa, la)
	trb, err := suite.Tree(wb.LaunchDir(sb, lb))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range trb.Processes {
		if _, ok := a.Procs[q.PID]; ok {
			t.Errorf("process %d (%s) of rollout B is among rollout A's paused processes", q.PID, q.Comm)
		}
		if st, ok := harnesstest.ReadStat(q.PID); ok && (st.State == 'T' || st.State == 't') {
			t.Errorf("process %d (%s) of rollout B is stopped while A is paused", q.PID, q.Comm)
		}
	}
	rb := wb.mustSucceed(hb) // B finishes while A is held
	wb.CheckOneLaunch(rb.Launches, 0)
	wa.Commit(pa, "ck-a")
	wa.Resume(pa, "ck-a")
	ra := wa.mustSucceed(ha)
	wa.CheckOneLaunch(ra.Launches, 1)
	t.Logf("A paused (%d processes) while B's %d processes ran on and B finished; then A finished: %s",
		len(a.Procs), len(trb.Processes), wa.checkOneToolRun(wa.Model.Requests(), 1))
}

// TestClaudePauseMidStream: a checkpoint pauses Claude Code while the reply with
// its tool call is still streaming (the fake paces its events). While
// Claude Code is paused the rest of the stream arrives and waits unread in its
// socket (the queued bytes grow), and nothing in the sandbox changes; after
// the checkpoint opens Claude Code reads it, runs the tool and finishes: one
// launch, pauses 1, no model call repeated.
func TestClaudePauseMidStream(t *testing.T) {
	t.Parallel()
	base := script("touch done.txt", "touch done.txt")
	w := newWorld(t, "stream", fakemodel.Options{Script: func(r fakemodel.Request) fakemodel.Reply {
		rep := base(r)
		if rep.ToolCall != nil {
			rep.Pace = 800 * time.Millisecond
		}
		return rep
	}})
	p := newParticipant()
	h := w.Start(w.Runner(w.adapter(nil), p), 1)
	w.Eventually("the first model request", func() (bool, string) {
		n := len(w.Model.Requests())
		return n >= 1, fmt.Sprintf("%d requests", n)
	})
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	cx := w.Harness(sb, l1)
	port := w.ModelPort()

	a, q0 := w.PausedLook(p, "ck-1", sb, l1, port)
	time.Sleep(harnesstest.Hold)
	b := w.Observe(sb, l1)
	q1, err := harnesstest.RxQueued(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("paused mid-stream, processes %v: %s", harnesstest.Comms(a), compareStill(t, a, b))
	if q1 <= q0 {
		t.Errorf("no stream bytes arrived while paused (%d then %d queued): the pause did not come mid-stream", q0, q1)
	}
	if n := len(w.Model.Requests()); n != 1 {
		t.Errorf("%d model requests by the end of the pause, want 1", n)
	}
	w.Resume(p, "ck-1")

	r := w.mustSucceed(h)
	w.CheckOneLaunch(r.Launches, 1)
	w.CheckSameHarnessFinished(sb, l1, cx)
	t.Logf("%d stream bytes arrived unread while paused (%d queued at the pause); %s", q1-q0, q0, w.checkOneToolRun(w.Model.Requests(), 1))
}
