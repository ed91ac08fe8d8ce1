package pie2e

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/pi"
)

// crashed is what crashAfterSnapshot leaves: the sandbox attempt 1 ran in,
// the fork the restore made, the committed records, the model requests of
// attempt 1, and the session saved in the snapshot.
type crashed struct {
	harnesstest.Crash
	saved *pi.Session
}

// crashAfterSnapshot runs attempt 1 until ready, checkpoints it (pause,
// the owner's snapshot, commit, continue), lets it go on, then crashes the
// driver (the run is cancelled with driver.ErrCrashed: nothing is cleaned
// up) while lasts holds. The owner restores the checkpoint: it stops every
// launch of the old sandbox and forks the snapshot under a new sandbox id.
func (w *world) crashAfterSnapshot(ready, lasts func(sandboxID, launchID string)) crashed {
	t := w.T
	t.Helper()
	c := crashed{Crash: w.CrashAfterSnapshot(w.adapter(), newParticipant(), ready, lasts)}
	files, _ := filepath.Glob(filepath.Join(w.Local.SnapshotPath(c.Snapshot), local.RootFolder, "state", "pi", "*", "sessions", "*.jsonl"))
	if len(files) != 1 {
		t.Fatalf("session files in the snapshot: %v, want one", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if c.saved, err = pi.ParseSession(data); err != nil {
		t.Fatalf("the saved session: %v", err)
	}
	return c
}

// relaunch restores the committed records into a new participant (a new
// driver after the crash) and runs attempt 2, which must be verified, in
// two launches: the crashed one in the old sandbox, the relaunch in the
// fork.
func (w *world) relaunch(c crashed) result {
	w.T.Helper()
	p2 := newParticipant()
	w.Restore(p2, "ck-1", c.Committed)
	r := w.mustSucceed(w.Start(w.Runner(w.adapter(), p2), 2))
	w.CheckRelaunch(r.Launches, c.Crash)
	return r
}

// lastRole is the role of the saved session's last message.
func lastRole(s *pi.Session) string {
	if len(s.Messages) == 0 {
		return ""
	}
	return s.Messages[len(s.Messages)-1].Role
}

// checkAdded checks, byte for byte, that next is before with exactly added
// messages appended to its messages array: every other byte of the body
// the same (the system prompt, the tools, the task), and every message
// before as sent. It returns the added messages.
func checkAdded(t *testing.T, before, next fakemodel.Request, added int) []fakemodel.Message {
	t.Helper()
	a, restA, errA := before.SentMessages()
	b, restB, errB := next.SentMessages()
	if errA != nil || errB != nil {
		t.Fatalf("the requests' messages: %v, %v", errA, errB)
	}
	if !bytes.Equal(restA, restB) {
		t.Errorf("the requests differ outside their messages:\n%s\n%s", restA, restB)
	}
	if len(b) != len(a)+added {
		t.Fatalf("%d messages, then %d; want %d added", len(a), len(b), added)
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			t.Errorf("message %d differs:\n%s\n%s", i, a[i], b[i])
		}
	}
	return next.Messages[len(a):]
}

// checkTaskOnly fails the test for a request whose user turns are not the
// task alone, byte for byte.
func checkTaskOnly(t *testing.T, reqs []fakemodel.Request) {
	t.Helper()
	for _, q := range reqs {
		if u := userTurns(q); len(u) != 1 || u[0] != task {
			t.Errorf("request %s: user turns %.120q, want the task alone", harnesstest.DescribeRequest(q), u)
		}
	}
}

// TestPiCrashMidToolResumes: a checkpoint is taken while Pi's bash call
// runs, the run goes on, and the driver crashes before the tool ends. The
// saved session (in the snapshot) starts with the task and ends with the
// completed response that made the call. The relaunch in the fork
// continues it (resumed, the reason saying what is sent): attempt 2's
// first request is, byte for byte, attempt 1's request with exactly two
// messages added, the call the model made and Pi's own error result "No
// result provided" for it; no user turn is added. The model calls the
// tool again, gets its result, answers, and the run is verified; the
// session is the saved one continued, its user turns unchanged.
func TestPiCrashMidToolResumes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "crash", fakemodel.Options{Script: script("sleep 25; touch done.txt", "touch done.txt")})
	waitSleep := func(sandboxID, launchID string) { w.WaitProc(sandboxID, launchID, "sleep") }
	c := w.crashAfterSnapshot(waitSleep, waitSleep)
	if ok, why := c.saved.Continuable(task); !ok || len(c.saved.Responses()) != 1 || lastRole(c.saved) != "assistant" {
		t.Fatalf("the saved session: continuable %v (%s), %d responses, ends with %s; want the task, the call", ok, why, len(c.saved.Responses()), lastRole(c.saved))
	}
	if n := len(c.Attempt1); n != 1 {
		t.Fatalf("attempt 1 made %d model requests, want the tool call alone", n)
	}
	r := w.relaunch(c)
	l2 := r.Launches[1]
	if !l2.Resumed || !strings.Contains(l2.Reason, "starts with the task and holds 1 completed model response; continuing it with Agent.continue()") ||
		!strings.Contains(l2.Reason, `sending the interrupted tool call with Pi's own error result "No result provided" (no turn added)`) {
		t.Errorf("launch 2: resumed %v, reason %q; want resumed at the interrupted call", l2.Resumed, l2.Reason)
	}
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	if len(a2) != 2 {
		t.Fatalf("attempt 2 made %d model requests, want 2 (the call again, the final)", len(a2))
	}
	added := checkAdded(t, c.Attempt1[0], a2[0], 2)
	if call, res := added[0], added[1]; call.Role != "assistant" || len(call.ToolCalls) != 1 || call.ToolCalls[0].Name != "bash" ||
		!strings.Contains(call.ToolCalls[0].Arguments, "sleep 25") || !isNoResult(res) || res.ToolCallID != call.ToolCalls[0].ID {
		t.Errorf("the added messages %+v, %+v; want the call and Pi's error result for it", call, res)
	}
	harnesstest.CheckNoRepeats(t, append(slices.Clone(c.Attempt1), a2...))
	checkTaskOnly(t, w.Model.Requests())
	if r.Response.SessionID != c.saved.ID {
		t.Errorf("attempt 2 ended in session %s, want the saved %s continued", r.Response.SessionID, c.saved.ID)
	}
	t.Logf("launch 2 reason %q; attempt 2's first request: %s", l2.Reason, harnesstest.DescribeRequest(a2[0]))
}

// TestPiCrashAfterToolResumes: the checkpoint is taken while the model's
// answer to the tool's result is held, and the driver crashes. Pi saved
// the result before it sent the request (the snapshot's session ends
// with it). The relaunch continues the session adding nothing: attempt
// 2's one request is byte for byte the request in flight at the crash; the
// model answers and the run is verified.
func TestPiCrashAfterToolResumes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "after", fakemodel.Options{Script: script("touch done.txt", "touch done.txt"),
		Holdable: func(r fakemodel.Request) bool { return r.LastMessage().Role == "tool" }})
	w.Model.Hold(1)
	defer w.Model.Release() // attempt 1's request, whose client is gone
	c := w.crashAfterSnapshot(func(string, string) { w.WaitHeld(1) }, func(string, string) {
		if w.Model.Held() != 1 {
			w.T.Fatalf("the answer to the tool result is no longer held")
		}
	})
	if len(c.Attempt1) != 2 || lastRole(c.saved) != "toolResult" {
		t.Fatalf("attempt 1 made %d model requests and its saved session ends with %q; want the call and the one held, the result saved", len(c.Attempt1), lastRole(c.saved))
	}
	r := w.relaunch(c)
	l2 := r.Launches[1]
	if !l2.Resumed || !strings.Contains(l2.Reason, "sending the saved tool results whose answer never came (no turn added)") {
		t.Errorf("launch 2: resumed %v, reason %q; want resumed with the saved tool result", l2.Resumed, l2.Reason)
	}
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	if len(a2) != 1 {
		t.Fatalf("attempt 2 made %d model requests, want 1 (the final)", len(a2))
	}
	if held := c.Attempt1[1]; !bytes.Equal(a2[0].Body, held.Body) {
		t.Errorf("attempt 2's request is not the one in flight at the crash:\n%s\n%s", held.Body, a2[0].Body)
	}
	checkTaskOnly(t, w.Model.Requests())
	t.Logf("launch 2 reason %q; attempt 2's one request is the %d bytes in flight at the crash", l2.Reason, len(a2[0].Body))
}

// TestPiStopAtCheckpointContinues: with pause_at_checkpoints false, a
// checkpoint stops Pi while its bash call runs `sleep` (ngsup's stop:
// SIGINT to every process of the launch, on which the launcher kills the
// tool's process group, then SIGKILL to whatever is left): no process of
// the stopped launch survives the checkpoint, and Pi recorded nothing. The
// launch after the checkpoint continues the saved session: its request is
// the first one with the call and Pi's error result for it added, no user
// turn; the model calls the tool again and the run is verified.
func TestPiStopAtCheckpointContinues(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "stopck", fakemodel.Options{Script: script("sleep 25; touch done.txt", "touch done.txt")})
	off := false
	p := newParticipant()
	opt := pi.Options{}
	opt.PauseAtCheckpoints = &off
	h := w.Start(w.Runner(w.adapterWith(opt), p), 1)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	tr := w.WaitProc(sb, l1, "sleep")
	w.Prepare(p, "ck-1")
	for _, q := range tr.Processes {
		if proctest.Same(q.PID, q.StartTicks) {
			t.Errorf("process %d (%s) of the stopped launch survived the stop", q.PID, q.Comm)
		}
	}
	w.Commit(p, "ck-1")
	w.Resume(p, "ck-1")
	r := w.mustSucceed(h)
	if len(r.Launches) != 2 {
		t.Fatalf("%d launches, want 2 (stopped at the checkpoint, continued): %+v", len(r.Launches), r.Launches)
	}
	l2 := r.Launches[1]
	if r.Launches[0].Outcome != driver.OutcomeInterrupted || !l2.Resumed || l2.Outcome != driver.OutcomeFinished ||
		!strings.Contains(l2.Reason, `sending the interrupted tool call with Pi's own error result "No result provided" (no turn added)`) {
		t.Errorf("launches %+v; want the first interrupted, the second resumed at the interrupted call, finished", r.Launches)
	}
	reqs := w.Model.Requests()
	harnesstest.CheckNoRepeats(t, reqs)
	if len(reqs) != 3 {
		t.Fatalf("%d model requests, want 3 (the call, the call again after the continue, the final)", len(reqs))
	}
	if added := checkAdded(t, reqs[0], reqs[1], 2); !isNoResult(added[1]) {
		t.Errorf("the request after the continue ends with %+v, want Pi's error result", added[1])
	}
	checkTaskOnly(t, reqs)
	t.Logf("%d processes of the stopped launch gone; launch 2 reason %q", len(tr.Processes), l2.Reason)
}
