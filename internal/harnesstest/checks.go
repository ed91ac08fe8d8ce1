package harnesstest

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/gymcheck"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/proto"
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

// ToolRun is what one completed single-tool run looks like on a
// harness's wire, for CheckToolRun.
type ToolRun struct {
	// API is the wire the harness speaks (fakemodel.APIResponses) and Path
	// its endpoint after the rollout's prefix ("/v1/responses").
	API, Path string
	// Tool is the name of the harness's shell tool ("exec_command").
	Tool string
	// UserTurns are the user turns of a request, each byte for byte: the
	// harness's own blocks left out.
	UserTurns func(fakemodel.Request) []string
	// Synthetic tells a tool result the harness made up for an interrupted
	// call (Codex's "aborted") from a real one.
	Synthetic func(fakemodel.Message) bool
	// TaskLast, when set, wants the first request to end with the task as
	// a user message of one part.
	TaskLast bool
}

// CheckToolRun checks the model requests of one completed single-tool run
// of an attempt: exactly two (the tool call, the final), all on the
// attempt's prefix and the harness's wire, the task the only user turn of
// each byte for byte, the second ending with the call the model made and
// its real (not synthetic) result, none repeated. It returns a summary.
func (w *World) CheckToolRun(reqs []fakemodel.Request, attempt int, run ToolRun) string {
	t := w.T
	t.Helper()
	CheckNoRepeats(t, reqs)
	if len(reqs) != 2 {
		for i, r := range reqs {
			t.Logf("model request %d: %s", i+1, DescribeRequest(r))
		}
		t.Fatalf("%d model requests, want 2 (the tool call, the final)", len(reqs))
	}
	prefix := fmt.Sprintf("/ng-rollout/%s-a%d%s", w.Rollout, attempt, run.Path)
	for _, r := range reqs {
		if r.Attempt != attempt || r.Path != prefix || r.API != run.API {
			t.Errorf("request %s (%s): attempt %d, want %d on %s", r.Path, r.API, r.Attempt, attempt, prefix)
		}
		if u := run.UserTurns(r); len(u) != 1 || u[0] != w.Task {
			t.Errorf("request %s: user turns %d (%.80q), want the task alone, byte for byte", r.Path, len(u), u)
		}
	}
	if last := reqs[0].LastMessage(); run.TaskLast && (last.Role != "user" || len(last.Parts) != 1 || last.Parts[0] != w.Task) {
		t.Errorf("the first request ends with %s %.80q, want the user's task exactly", last.Role, last.Content)
	}
	final := reqs[1]
	n := len(final.Messages)
	if n < 3 {
		t.Fatalf("the final request's history is %+v", final.Messages)
	}
	call, res := final.Messages[n-2], final.Messages[n-1]
	if res.Role != "tool" || call.Role != "assistant" || len(call.ToolCalls) != 1 || call.ToolCalls[0].ID != res.ToolCallID || call.ToolCalls[0].Name != run.Tool {
		t.Errorf("the final request ends with %+v then %+v, want the %s call and its result", call, res, run.Tool)
	}
	if run.Synthetic(res) {
		t.Errorf("the tool result is %s's synthetic %q", w.harness, res.Content)
	}
	return fmt.Sprintf("%d model requests (tool call, final), none repeated, the task the only user turn", len(reqs))
}

// GymShaper is gymcheck.Shaper: an adapter that shapes its response as
// the /run reply of `ngdriver serve` carries it.
type GymShaper = gymcheck.Shaper

// CheckGymReply shapes the adapter's response (a's GymResult, with the
// world's run body) and checks the NeMoGymResponse (CheckGymResponse). It
// returns the reply's own fields, for the suite to check.
func (w *World) CheckGymReply(a GymShaper, response json.RawMessage, tool, final string) map[string]json.RawMessage {
	w.T.Helper()
	return CheckGymReply(w.T, a, response, w.Body(), tool, final)
}

// CheckGymReply is gymcheck.Reply: it shapes a stored response as the
// adapter's /run reply carries it and checks the NeMoGymResponse; it
// returns the reply's own fields.
func CheckGymReply(t testing.TB, a GymShaper, response, body json.RawMessage, tool, final string) map[string]json.RawMessage {
	t.Helper()
	return gymcheck.Reply(t, a, response, body, tool, final)
}

// CheckGymResponse is gymcheck.Response: it checks a NeMoGymResponse as a
// Gym trainer reads it.
func CheckGymResponse(t testing.TB, resp json.RawMessage, tool, final string) {
	t.Helper()
	gymcheck.Response(t, resp, tool, final)
}

// SessionResponse is what the tests read of the response of an adapter
// that collects the harness's session file (Codex, Claude Code, Pi).
type SessionResponse struct {
	// ExitCode is the harness's exit code.
	ExitCode int `json:"exit_code"`
	// SessionID and SessionPath are the session and its file in the
	// sandbox; Session its lines.
	SessionID   string          `json:"session_id"`
	SessionPath string          `json:"session_path"`
	Session     json.RawMessage `json:"session"`
	// FinalText is the harness's last answer.
	FinalText string `json:"final_text"`
	// SessionError says why the session could not be read.
	SessionError string `json:"session_error"`
	// StderrTail is the end of the harness's stderr.
	StderrTail string `json:"stderr_tail"`
}

// Check fails the test unless the harness exited 0, its session was read
// and its final text is final.
func (r SessionResponse) Check(t *testing.T, final string) {
	t.Helper()
	if r.ExitCode != 0 || r.SessionError != "" || r.FinalText != final {
		t.Errorf("response: exit code %d, session error %q, final text %q (want 0, none, %q); stderr tail %q",
			r.ExitCode, r.SessionError, r.FinalText, final, r.StderrTail)
	}
}
