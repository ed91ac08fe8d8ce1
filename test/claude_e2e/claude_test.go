package claudee2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/claude"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/harness"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// userTurns are the user turns of a request, each byte for byte: the text
// parts of its user messages that are not Claude Code's own
// <system-reminder> blocks (it sends those as text parts of the first
// user message), a message with none of its own left out.
func userTurns(r fakemodel.Request) []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role != "user" {
			continue
		}
		var own []string
		for _, p := range m.Parts {
			if !strings.HasPrefix(p, "<system-reminder>") {
				own = append(own, p)
			}
		}
		if len(own) > 0 {
			out = append(out, strings.Join(own, ""))
		}
	}
	return out
}

// isInterrupted tells Claude Code's synthetic result of a tool call
// interrupted by a crash.
func isInterrupted(m fakemodel.Message) bool {
	return m.Role == "tool" && strings.Contains(m.Content, "interrupted")
}

// toolRun is one completed single-tool run of Claude Code on the wire:
// two Messages requests, the Bash call and its real result (not Claude
// Code's interrupted one).
var toolRun = harnesstest.ToolRun{
	API: fakemodel.APIMessages, Path: "/v1/messages", Tool: "Bash", UserTurns: userTurns, Synthetic: isInterrupted,
}

// checkOneToolRun is harnesstest.World.CheckToolRun of Claude Code
// (toolRun).
func (w *world) checkOneToolRun(reqs []fakemodel.Request, attempt int) string {
	w.T.Helper()
	return w.CheckToolRun(reqs, attempt, toolRun)
}

// crashed is what crashAfterSnapshot leaves: the sandbox attempt 1 ran in,
// the fork the restore made, the committed records, the session saved in
// the snapshot, and the model requests of attempt 1.
type crashed struct {
	harnesstest.Crash
	saved *claude.Session
}

// crashAfterSnapshot runs attempt 1 until ready, checkpoints it (pause,
// the owner's snapshot, commit, continue), lets it go on, then crashes the
// driver (the run is cancelled with driver.ErrCrashed: nothing is cleaned
// up) while lasts holds. The owner restores the checkpoint: it stops every
// launch of the old sandbox and forks the snapshot under a new sandbox id.
func (w *world) crashAfterSnapshot(ready, lasts func(sandboxID, launchID string)) crashed {
	t := w.T
	t.Helper()
	c := crashed{Crash: w.CrashAfterSnapshot(w.adapter(nil), newParticipant(), ready, lasts)}
	files, _ := filepath.Glob(filepath.Join(w.Local.SnapshotPath(c.Snapshot), local.RootFolder, "state", "claude", "*", "config", "projects", "*", "*.jsonl"))
	if len(files) != 1 {
		t.Fatalf("session files in the snapshot: %v, want one", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if c.saved, err = claude.ParseSession(data); err != nil {
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
	h2 := w.Start(w.Runner(w.adapter(nil), p2), 2)
	r := w.mustSucceed(h2)
	w.CheckRelaunch(r.Launches, c.Crash)
	return r
}

// sameHistory says where b's messages first differ from a's (role, text,
// tool calls and results), "" when a is a prefix of b.
func sameHistory(a, b []fakemodel.Message) string {
	if len(b) < len(a) {
		return fmt.Sprintf("%d messages, fewer than the %d before", len(b), len(a))
	}
	for i, m := range a {
		n := b[i]
		if m.Role != n.Role || m.Content != n.Content || m.ToolCallID != n.ToolCallID || fmt.Sprint(m.ToolCalls) != fmt.Sprint(n.ToolCalls) {
			return fmt.Sprintf("message %d: %s %.120q, then %s %.120q", i, m.Role, m.Content, n.Role, n.Content)
		}
	}
	return ""
}

// checkContinued checks what the model got from a relaunch that continued
// the saved session: the first request of attempt 2 is the request attempt
// 1 made last (its history byte for byte as normalised: system, the task,
// tool calls and results), then the model's reply to it where it had one
// (replied: the tool call), then only the message due, which ends it
// (want); the task is its only user turn; no request of attempt 2 repeats
// one attempt 1 got an answer to, nor another of its own. It returns the
// first request of attempt 2.
func (w *world) checkContinued(c crashed, replied bool, want func(fakemodel.Message) bool) fakemodel.Request {
	t := w.T
	t.Helper()
	a1 := c.Attempt1
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	if len(a2) == 0 {
		t.Fatal("attempt 2 made no model request")
	}
	answered := a1
	if !replied {
		answered = a1[:len(a1)-1] // the last was in flight at the crash
	}
	harnesstest.CheckNoRepeats(t, append(slices.Clone(answered), a2...))
	first, before := a2[0], a1[len(a1)-1]
	extra := 0 // the request in flight at the crash, sent again
	if replied {
		extra = 2 // the call the model made, and the message due
	}
	d := sameHistory(before.Messages, first.Messages)
	if d == "" && len(first.Messages) != len(before.Messages)+extra {
		d = fmt.Sprintf("%d messages, want %d (the history and %d more)", len(first.Messages), len(before.Messages)+extra, extra)
	}
	if d != "" {
		t.Errorf("attempt 2's first request against attempt 1's last: %s\n%s\n%s", d, harnesstest.DescribeRequest(before), harnesstest.DescribeRequest(first))
	}
	if last := first.LastMessage(); !want(last) {
		t.Errorf("attempt 2's first request ends with %s %.200q, not the message due", last.Role, last.Content)
	}
	for _, q := range a2 {
		if u := userTurns(q); len(u) != 1 || u[0] != w.Task {
			t.Errorf("attempt 2 request %s: user turns %.80q, want the task alone", harnesstest.DescribeRequest(q), u)
		}
		for _, m := range q.Messages {
			if m.Role == "assistant" && strings.Contains(m.Content, "No response requested") {
				t.Errorf("attempt 2 sent Claude Code's synthetic assistant message: %s", harnesstest.DescribeRequest(q))
			}
		}
	}
	if n := len(harnesstest.ByAttempt(w.Model.Requests(), 1)); n != len(a1) {
		t.Errorf("attempt 1's Claude Code made %d more model requests after the crash", n-len(a1))
	}
	return first
}

// TestClaudeCrashMidToolResumes: a checkpoint is taken while Claude Code's
// Bash call runs, the run goes on, and the driver crashes before the tool
// ends. The saved session (in the snapshot) starts with the task and
// holds the completed response that made the call, with no result for it.
// The relaunch in the fork continues it (resumed, the reason saying what
// is sent): the model's first request of attempt 2 is attempt 1's request,
// then the call the model made, then Claude Code's own interrupted result
// for it and nothing else: no synthetic assistant message, no added user
// turn. The model calls the tool again, gets its result, answers, and the
// run is verified; the session is the saved one, its user turns unchanged.
func TestClaudeCrashMidToolResumes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "crash", fakemodel.Options{Script: script("echo start; sleep 25; touch done.txt", "touch done.txt")})
	waitSleep := func(sandboxID, launchID string) { w.WaitProc(sandboxID, launchID, "sleep") }
	// Claude Code saves the reply from a 100 ms timer and may start the
	// tool first (docs/claude.md): the checkpoint waits for the save, so
	// the saved session holds the call (one saved without it is
	// TestClaudeCrashReplyUnsaved).
	ready := func(sandboxID, launchID string) {
		waitSleep(sandboxID, launchID)
		w.waitSessionHolds(sandboxID, `"type":"tool_use"`)
	}
	c := w.crashAfterSnapshot(ready, waitSleep)
	if ok, why := c.saved.Continuable(task); !ok || len(c.saved.Responses()) != 1 {
		t.Fatalf("the saved session: continuable %v (%s), %d responses; want the task and one completed response", ok, why, len(c.saved.Responses()))
	}
	if n := len(c.Attempt1); n != 1 {
		t.Fatalf("attempt 1 made %d model requests, want the tool call alone", n)
	}
	r := w.relaunch(c)
	l2 := r.Launches[1]
	if !l2.Resumed || !strings.Contains(l2.Reason, "starts with the task and holds 1 completed model response; continuing it") ||
		!strings.Contains(l2.Reason, "the interrupted tool call with Claude Code's interrupted result (no turn added)") {
		t.Errorf("launch 2: resumed %v, reason %q; want resumed at the interrupted call", l2.Resumed, l2.Reason)
	}
	first := w.checkContinued(c, true, func(m fakemodel.Message) bool { return isInterrupted(m) && m.Content == claude.InterruptedText })
	n := len(first.Messages)
	if call := first.Messages[n-2]; len(call.ToolCalls) != 1 || call.ToolCalls[0].ID != first.LastMessage().ToolCallID {
		t.Errorf("attempt 2's first request ends with %+v then %+v, want attempt 1's call and its interrupted result", call, first.LastMessage())
	}
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	if len(a2) != 2 {
		t.Errorf("attempt 2 made %d model requests, want 2 (the call again, the final)", len(a2))
	}
	if r.Response.SessionID != c.saved.ID {
		t.Errorf("attempt 2 ended in session %s, want the saved %s continued", r.Response.SessionID, c.saved.ID)
	}
	after := parseResponseSession(t, r)
	if u := after.UserTurns(); !slices.Equal(u, c.saved.UserTurns()) {
		t.Errorf("the session's user turns after the relaunch %q, saved %q", u, c.saved.UserTurns())
	}
	t.Logf("launch 2 reason %q; attempt 2's first request: %s", l2.Reason, harnesstest.DescribeRequest(first))
}

// TestClaudeCrashAfterToolResumes: the checkpoint is taken while the
// model's reply to the tool's result is held (the tool has run: its result
// is saved, its answer never came), and the driver crashes. The relaunch
// continues the session by sending the saved tool result again: attempt
// 2's first request is exactly the request that was in flight at the
// crash (the same history, the real result, nothing added), the one model
// call for the interrupted turn; the model answers and the run is
// verified.
func TestClaudeCrashAfterToolResumes(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "after", fakemodel.Options{Script: script("touch done.txt", "touch done.txt"),
		Holdable: func(r fakemodel.Request) bool { return r.LastMessage().Role == "tool" }})
	w.Model.Hold(1)
	// Claude Code writes the tool result into its session file a moment
	// after it sends the request that carries it: the checkpoint waits
	// for it, so the saved session holds the result (one saved without
	// it is continued as TestClaudeCrashMidToolResumes shows).
	ready := func(sandboxID, _ string) {
		w.WaitHeld(1)
		w.Eventually("the tool result in the session file", func() (bool, string) {
			files, _ := filepath.Glob(filepath.Join(w.Local.HostPath(sandboxID), local.RootFolder, "state", "claude", "*", "config", "projects", "*", "*.jsonl"))
			for _, f := range files {
				if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), `"type":"tool_result"`) {
					return true, ""
				}
			}
			return false, fmt.Sprintf("session files %v", files)
		})
	}
	c := w.crashAfterSnapshot(ready, func(string, string) {
		if w.Model.Held() != 1 {
			w.T.Fatalf("the reply to the tool result is no longer held")
		}
	})
	defer w.Model.Release() // attempt 1's request, whose client is gone
	if len(c.Attempt1) != 2 {
		t.Fatalf("attempt 1 made %d model requests, want the tool call and the one held", len(c.Attempt1))
	}
	r := w.relaunch(c)
	l2 := r.Launches[1]
	if !l2.Resumed || !strings.Contains(l2.Reason, "sending the saved tool results whose answer never came (no turn added)") {
		t.Errorf("launch 2: resumed %v, reason %q; want resumed with the saved tool results", l2.Resumed, l2.Reason)
	}
	first := w.checkContinued(c, false, func(m fakemodel.Message) bool { return m.Role == "tool" && !isInterrupted(m) })
	held := c.Attempt1[1]
	if first.HistoryKey() != held.HistoryKey() {
		t.Errorf("attempt 2's first request is not the one in flight at the crash:\n%s\n%s", harnesstest.DescribeRequest(held), harnesstest.DescribeRequest(first))
	}
	if a2 := harnesstest.ByAttempt(w.Model.Requests(), 2); len(a2) != 1 {
		t.Errorf("attempt 2 made %d model requests, want 1 (the final)", len(a2))
	}
	t.Logf("launch 2 reason %q; attempt 2's only request is the one held at the crash: %s", l2.Reason, harnesstest.DescribeRequest(first))
}

// parseResponseSession is the session the run's response holds.
func parseResponseSession(t *testing.T, r result) *claude.Session {
	t.Helper()
	var lines []json.RawMessage
	if err := json.Unmarshal(r.Response.Session, &lines); err != nil {
		t.Fatalf("the response's session: %v", err)
	}
	var data []byte
	for _, l := range lines {
		data = append(append(data, l...), '\n')
	}
	s, err := claude.ParseSession(data)
	if err != nil {
		t.Fatalf("the response's session: %v", err)
	}
	return s
}

// TestClaudeStopAtCheckpointContinues: with pause_at_checkpoints false, a
// checkpoint stops Claude Code while its Bash call runs (SIGINT, as every
// stop begins), and the launch after the checkpoint continues the saved
// session. A SIGINT makes Claude Code record a rejection of the running
// call ("The user doesn't want to proceed ...") and a note "[Request
// interrupted by user for tool use]"; the continuation passes over both:
// the model's next request is the first one's history, the call, and
// Claude Code's interrupted result, with no added user turn and neither
// record; the model calls the tool again and the run is verified.
func TestClaudeStopAtCheckpointContinues(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "stopck", fakemodel.Options{Script: script("echo start; sleep 25; touch done.txt", "touch done.txt")})
	off := false
	p := newParticipant()
	h := w.Start(w.Runner(w.adapterWith(claude.Options{CLIOptions: harness.CLIOptions{PauseAtCheckpoints: &off}}), p), 1)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	w.WaitProc(sb, l1, "sleep")
	w.Prepare(p, "ck-1")
	w.Commit(p, "ck-1")
	w.Resume(p, "ck-1")
	r := w.mustSucceed(h)
	if len(r.Launches) != 2 {
		t.Fatalf("%d launches, want 2 (stopped at the checkpoint, continued): %+v", len(r.Launches), r.Launches)
	}
	l2 := r.Launches[1]
	if r.Launches[0].Outcome != driver.OutcomeInterrupted || !l2.Resumed || l2.Outcome != driver.OutcomeFinished ||
		!strings.Contains(l2.Reason, "sending the interrupted tool call with Claude Code's interrupted result (no turn added)") {
		t.Errorf("launches %+v; want the first interrupted, the second resumed at the interrupted call, finished", r.Launches)
	}
	reqs := w.Model.Requests()
	harnesstest.CheckNoRepeats(t, reqs)
	if len(reqs) != 3 {
		t.Fatalf("%d model requests, want 3 (the call, the call again after the continue, the final)", len(reqs))
	}
	before, next := reqs[0], reqs[1]
	if d := sameHistory(before.Messages, next.Messages); d != "" || len(next.Messages) != len(before.Messages)+2 {
		t.Errorf("the request after the continue against the first: %q, %d messages then %d\n%s\n%s", d, len(before.Messages), len(next.Messages),
			harnesstest.DescribeRequest(before), harnesstest.DescribeRequest(next))
	}
	if last := next.LastMessage(); last.Content != claude.InterruptedText {
		t.Errorf("the request after the continue ends with %s %.200q, want Claude Code's interrupted result", last.Role, last.Content)
	}
	for _, q := range reqs {
		if u := userTurns(q); len(u) != 1 || u[0] != task {
			t.Errorf("request %s: user turns %.120q, want the task alone", harnesstest.DescribeRequest(q), u)
		}
		for _, m := range q.Messages {
			if strings.Contains(m.Content, "interrupted by user") || strings.Contains(m.Content, "doesn't want to proceed") {
				t.Errorf("request %s carries Claude Code's interrupt record %.120q", harnesstest.DescribeRequest(q), m.Content)
			}
		}
	}
	t.Logf("launch 2 reason %q; the request after the continue: %s", l2.Reason, harnesstest.DescribeRequest(next))
}

// TestClaudeCrashTwiceResumes: a crash mid-tool, a continue in the fork
// whose tool call (made again by the model) is checkpointed and crashed in
// its turn, and a second continue in the fork of that: the session the
// second continue starts from holds what the first continue appended to
// the saved one (the interrupted result, the call made again). Attempt
// 3's first request is attempt 2's, then the call, then the interrupted
// result: the task the only user turn throughout, no request repeated,
// three calls in the final chain, and the run is verified.
func TestClaudeCrashTwiceResumes(t *testing.T) {
	t.Parallel()
	crashTwice(t, "twice", false)
}

// crashTwice is the body of TestClaudeCrashTwiceResumes, named name. With
// unsaved, Claude Code's writes to its session file are held from before
// attempt 2's launch until after ck-2's snapshot (HoldWrites), so that
// snapshot's session holds nothing of attempt 2 although its reply had
// come, been printed and its tool run (TestClaudeCrashTwiceReplyUnsaved);
// attempt 1 is then checkpointed only once its session holds its call, so
// that the relaunch in the fork has nothing to add to the file held.
func crashTwice(t *testing.T, name string, unsaved bool) {
	w := newWorld(t, name, fakemodel.Options{Script: func(r fakemodel.Request) fakemodel.Reply {
		last := r.LastMessage()
		switch {
		case last.Role == "tool" && strings.Contains(last.Content, "interrupted") && r.Attempt == 2:
			return bashCall(r, "echo again; sleep 25; touch done.txt")
		case last.Role == "tool" && strings.Contains(last.Content, "interrupted"):
			return bashCall(r, "touch done.txt")
		case last.Role == "tool":
			return fakemodel.Reply{Text: finalText}
		}
		return bashCall(r, "echo start; sleep 25; touch done.txt")
	}})
	waitSleep := func(sandboxID, launchID string) { w.WaitProc(sandboxID, launchID, "sleep") }
	ready := waitSleep
	if unsaved {
		ready = func(sandboxID, launchID string) {
			waitSleep(sandboxID, launchID)
			w.waitSessionHolds(sandboxID, `"type":"tool_use"`)
		}
	}
	c := w.crashAfterSnapshot(ready, waitSleep)

	// Attempt 2: continued in the fork, then checkpointed while its tool
	// sleeps, and crashed.
	p2 := newParticipant()
	w.Restore(p2, "ck-1", c.Committed)
	var hold *harnesstest.WriteHold
	if unsaved {
		hold = w.HoldWrites(w.sessionFile(c.Fork))
	}
	h2 := w.Start(w.Runner(w.adapter(nil), p2), 2)
	l2 := w.LaunchID(2, 2, c.Fork)
	w.WaitProc(c.Fork, l2, "sleep")
	if unsaved {
		w.checkUnsaved(c.Fork, l2, hold, "echo again")
	}
	w.Prepare(p2, "ck-2")
	snaps2, ck2 := w.Commit(p2, "ck-2")
	if unsaved {
		hold.Release()
		if s := w.snapshotSession(snaps2); len(s.Responses()) != 1 {
			t.Fatalf("ck-2's session holds %d completed model responses, want attempt 1's alone (attempt 2's reply unsaved)", len(s.Responses()))
		}
	}
	w.Resume(p2, "ck-2")
	w.WaitContinued(2)
	h2.Cancel(driver.ErrCrashed)
	if _, err := w.Wait(h2); !errors.Is(err, driver.ErrCrashed) {
		t.Fatalf("attempt 2 returned %v, want the crash", err)
	}
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	w.RestoreOwner("ck-2", ck2)
	fork2 := w.WaitSandbox(3)

	// Attempt 3: continued in the fork of the fork.
	p3 := newParticipant()
	w.Restore(p3, "ck-2", ck2)
	r := w.mustSucceed(w.Start(w.Runner(w.adapter(nil), p3), 3))
	if n := len(r.Launches); n != 3 {
		t.Fatalf("%d launches, want 3: %+v", n, r.Launches)
	}
	l3 := r.Launches[2]
	if !l3.Resumed || l3.SandboxID != fork2 || l3.Outcome != driver.OutcomeFinished ||
		!strings.Contains(l3.Reason, "holds 2 completed model responses; continuing it") ||
		!strings.Contains(l3.Reason, "sending the interrupted tool call") {
		t.Errorf("launch 3: %+v; want resumed in %s at the second interrupted call, finished", l3, fork2)
	}
	if unsaved && !strings.Contains(l3.Reason, "2 entries Claude Code had sent or received but not yet saved") {
		t.Errorf("launch 3's reason %q does not say the unsaved entries were recovered from launch 2's stdout", l3.Reason)
	}
	a3 := harnesstest.ByAttempt(w.Model.Requests(), 3)
	if len(a2) != 1 || len(a3) != 2 {
		t.Fatalf("attempt 2 made %d model requests, attempt 3 %d; want 1 (the call again) and 2 (the call, the final)", len(a2), len(a3))
	}
	harnesstest.CheckNoRepeats(t, append(append(slices.Clone(c.Attempt1), a2...), a3...))
	before, first := a2[0], a3[0]
	if d := sameHistory(before.Messages, first.Messages); d != "" || len(first.Messages) != len(before.Messages)+2 {
		t.Errorf("attempt 3's first request against attempt 2's: %q, %d then %d messages\n%s\n%s", d, len(before.Messages), len(first.Messages),
			harnesstest.DescribeRequest(before), harnesstest.DescribeRequest(first))
	}
	if last := first.LastMessage(); last.Content != claude.InterruptedText {
		t.Errorf("attempt 3's first request ends with %s %.200q, want the interrupted result", last.Role, last.Content)
	}
	for _, q := range w.Model.Requests() {
		if u := userTurns(q); len(u) != 1 || u[0] != task {
			t.Errorf("request %s: user turns %.120q, want the task alone", harnesstest.DescribeRequest(q), u)
		}
	}
	after := parseResponseSession(t, r)
	calls := 0
	for _, m := range after.Messages {
		calls += len(m.ToolUses())
	}
	if u := after.UserTurns(); len(u) != 1 || u[0] != task || calls != 3 {
		t.Errorf("the final session's chain: user turns %q, %d tool calls; want the task alone and 3 calls", u, calls)
	}
	t.Logf("launch 3 reason %q; attempt 3's first request: %s", l3.Reason, harnesstest.DescribeRequest(first))
}
