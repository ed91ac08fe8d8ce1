package codexe2e

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/codex"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// userTurns are the user messages of a request that the user gave (the
// task, a later prompt), each byte for byte: Codex's own
// <environment_context> block is left out.
func userTurns(r fakemodel.Request) []string {
	var out []string
	for _, m := range r.Messages {
		if m.Role == "user" && !strings.HasPrefix(m.Content, "<environment_context>") {
			out = append(out, m.Content)
		}
	}
	return out
}

// toolRun is one completed single-tool run of Codex on the wire: two
// Responses requests, the exec_command call and its real output (not
// Codex's synthetic "aborted"), the first ending with the task.
var toolRun = harnesstest.ToolRun{
	API: fakemodel.APIResponses, Path: "/v1/responses", Tool: "exec_command", UserTurns: userTurns,
	Synthetic: func(m fakemodel.Message) bool { return m.Content == "aborted" }, TaskLast: true,
}

// checkOneToolRun is harnesstest.World.CheckToolRun of Codex (toolRun).
func (w *world) checkOneToolRun(reqs []fakemodel.Request, attempt int) string {
	w.T.Helper()
	return w.CheckToolRun(reqs, attempt, toolRun)
}

// crashed is what crashAfterSnapshot leaves: the sandbox attempt 1 ran in,
// the fork the restore made, the committed records, the session saved in
// the snapshot, and the model requests of attempt 1.
type crashed struct {
	harnesstest.Crash
	saved     *codex.Session
	savedHome string // the saved CODEX_HOME inside the sandbox
}

// crashAfterSnapshot runs attempt 1 until its tool's sleep runs,
// checkpoints it (pause, the owner's snapshot, commit, continue), lets it
// go on, then crashes the driver (the run is cancelled with
// driver.ErrCrashed: nothing is cleaned up) while the tool still runs. The
// owner restores the checkpoint: it stops every launch of the old sandbox
// and forks the snapshot under a new sandbox id.
func (w *world) crashAfterSnapshot() crashed {
	t := w.T
	t.Helper()
	waitSleep := func(sandboxID, launchID string) { w.WaitProc(sandboxID, launchID, "sleep") }
	// The crash comes during the same tool call.
	c := crashed{Crash: w.CrashAfterSnapshot(w.adapter(nil), newParticipant(), waitSleep, waitSleep)}
	files, _ := filepath.Glob(filepath.Join(w.Local.SnapshotPath(c.Snapshot), local.RootFolder, "state", "codex", "*", "codex", "sessions", "*", "*", "*", "rollout-*.jsonl"))
	if len(files) != 1 {
		t.Fatalf("session files in the snapshot: %v, want one", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if c.saved, err = codex.ParseSession(data); err != nil {
		t.Fatalf("the saved session: %v", err)
	}
	rel, _ := filepath.Rel(w.Local.SnapshotPath(c.Snapshot), files[0])
	c.savedHome = path.Join("/sandbox", filepath.ToSlash(rel))
	for i := 0; i < 5; i++ { // up from .../codex/sessions/YYYY/MM/DD/rollout-*.jsonl
		c.savedHome = path.Dir(c.savedHome)
	}
	return c
}

// TestCodexCrashMidToolStartsFresh: a checkpoint is taken while Codex's
// tool call runs, the run goes on, and the driver crashes before the tool
// ends. The saved session (in the snapshot) starts with the task and holds
// the completed response that made the call, with no output for it. The
// relaunch in the fork does not continue it, since Codex cannot without a
// new user turn: launch 2 starts over in a fresh CODEX_HOME (resumed false,
// the reason saying why), makes its two model calls with the task the only
// user turn byte for byte, never sends Codex's synthetic "aborted" output,
// and is verified. Then a probe runs `codex exec resume` (with "", the
// least prompt it takes) on the saved session in the fork, on a prefix of
// its own: its first model request ends with the interrupted call, a
// synthetic "aborted" output and an added empty user turn, which is why
// the adapter starts over.
func TestCodexCrashMidToolStartsFresh(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "crash", fakemodel.Options{Script: script("sleep 25; touch done.txt", "touch done.txt")})
	c := w.crashAfterSnapshot()
	if ok, why := c.saved.Continuable(task); !ok || len(c.saved.Responses) != 1 {
		t.Fatalf("the saved session: continuable %v (%s), %d responses; want the task and one completed response", ok, why, len(c.saved.Responses))
	}
	if n := len(c.Attempt1); n != 1 {
		t.Errorf("attempt 1 made %d model requests, want the tool call alone", n)
	}

	p2 := newParticipant()
	w.Restore(p2, "ck-1", c.Committed)
	h2 := w.Start(w.Runner(w.adapter(nil), p2), 2)
	r := w.mustSucceed(h2)
	w.CheckRelaunch(r.Launches, c.Crash)
	l2 := r.Launches[1]
	if l2.Resumed ||
		!strings.Contains(l2.Reason, "starts with the task and holds 1 completed model response, but Codex cannot continue it without adding a user turn") ||
		!strings.Contains(l2.Reason, "starting over with the task in a fresh CODEX_HOME") {
		t.Errorf("launch 2: %+v; want in the fork %s, finished, not resumed, the reason saying why it starts over", l2, c.Fork)
	}
	if r.Response.SessionID == c.saved.ID {
		t.Errorf("attempt 2 answered from the saved session %s, want a fresh one", c.saved.ID)
	}
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	w.checkOneToolRun(a2, 2)
	if n := len(harnesstest.ByAttempt(w.Model.Requests(), 1)); n != len(c.Attempt1) {
		t.Errorf("attempt 1's Codex made %d more model requests after the crash", n-len(c.Attempt1))
	}
	savedCall := c.Attempt1[0].Body
	for _, q := range a2 {
		for _, m := range q.Messages {
			if m.Role == "tool" && m.Content == "aborted" {
				t.Errorf("attempt 2 sent Codex's synthetic aborted output: %s", harnesstest.DescribeRequest(q))
			}
		}
	}
	differ := "none"
	for i, m := range a2[0].Messages {
		if i >= len(c.Attempt1[0].Messages) || m.Content != c.Attempt1[0].Messages[i].Content {
			differ = fmt.Sprintf("message %d (%s) %.200q", i, m.Role, m.Content)
			break
		}
	}
	t.Logf("launch 2 reason %q; attempt 2's first request (%d bytes) against attempt 1's (%d bytes), first difference: %s",
		l2.Reason, len(a2[0].Body), len(savedCall), differ)

	probe := w.probeResume(c)
	n := len(probe.Messages)
	if n < 3 {
		t.Fatalf("the probe's first request: %s", harnesstest.DescribeRequest(probe))
	}
	call, out, user := probe.Messages[n-3], probe.Messages[n-2], probe.Messages[n-1]
	if len(call.ToolCalls) != 1 || out.Role != "tool" || out.Content != "aborted" || out.ToolCallID != call.ToolCalls[0].ID || user.Role != "user" || user.Content != "" {
		t.Errorf("the probe's first request ends with %+v, %+v, %+v; want the interrupted call, a synthetic \"aborted\" output, an added empty user turn", call, out, user)
	}
	if u := userTurns(probe); len(u) != 2 || u[0] != task {
		t.Errorf("the probe's user turns %q, want the task and the added one", u)
	}
	t.Logf("codex exec resume on the saved session sends: ... %s call %s, tool %q, user %q: a turn the task did not have",
		call.Role, call.ToolCalls[0].Name, out.Content, user.Content)
}

// probeResume runs `codex exec resume <saved id> ""` in the fork on the
// saved CODEX_HOME, pointed at the prefix probe-a9, and returns its first
// model request. It ends on its own (the script answers it to the end).
func (w *world) probeResume(c crashed) fakemodel.Request {
	w.T.Helper()
	sb, err := w.Local.Open(c.Fork)
	if err != nil {
		w.T.Fatal(err)
	}
	base := w.Model.URL() + "/ng-rollout/probe-a9/v1"
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{
		Argv: []string{w.codex, "exec", "resume", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
			"-c", "model_providers.ngharness.base_url=" + fmt.Sprintf("%q", base), c.saved.ID, ""},
		Env: map[string]string{"HOME": path.Join(path.Dir(c.savedHome), "home"), "CODEX_HOME": c.savedHome,
			"NGHARNESS_CODEX_API_KEY": "none"},
		Dir:     "/sandbox/work",
		Timeout: 2 * time.Minute,
	})
	if err != nil || res.ExitCode != 0 {
		w.T.Fatalf("codex exec resume: %v, exit code %d: %s", err, res.ExitCode, tailOf(res.Stderr))
	}
	var probe []fakemodel.Request
	for _, q := range w.Model.Requests() {
		if q.Rollout == "probe-a9" {
			probe = append(probe, q)
		}
	}
	if len(probe) == 0 {
		w.T.Fatalf("codex exec resume made no model request: %s", tailOf(res.Stderr))
	}
	if h := probe[0].Header.Get("x-codex-turn-metadata"); !strings.Contains(h, "cold_resume") {
		w.T.Logf("the probe's turn metadata %q does not say cold_resume", h)
	}
	return probe[0]
}

func tailOf(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// TestCodexCrashResumeOptIn: with resume_prompt set (the opt-in), the
// relaunch after a crash mid-tool continues the saved session with `codex
// exec resume` instead of starting over, and the record says what that
// costs: launch 2 resumed, its reason naming the added user turn. The
// model's first request of attempt 2 is the saved history, the
// interrupted call, Codex's synthetic "aborted" output and the added turn
// (the task and it the only user turns); the run is verified.
func TestCodexCrashResumeOptIn(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "optin", fakemodel.Options{Script: script("sleep 25; touch done.txt", "touch done.txt")})
	c := w.crashAfterSnapshot()
	prompt := "Continue."
	p2 := newParticipant()
	w.Restore(p2, "ck-1", c.Committed)
	h2 := w.Start(w.Runner(w.adapterWith(codex.Options{ResumePrompt: &prompt}), p2), 2)
	r := w.mustSucceed(h2)
	w.CheckRelaunch(r.Launches, c.Crash)
	l2 := r.Launches[1]
	if !l2.Resumed || l2.SandboxID != c.Fork || l2.Outcome != driver.OutcomeFinished ||
		!strings.Contains(l2.Reason, `adds the user turn "Continue." the task did not have (resume_prompt is set)`) {
		t.Errorf("launch 2: %+v; want resumed in the fork %s, finished, the reason naming the added turn", l2, c.Fork)
	}
	if r.Response.SessionID != c.saved.ID {
		t.Errorf("attempt 2 ended in session %s, want the saved %s continued", r.Response.SessionID, c.saved.ID)
	}
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	if len(a2) == 0 {
		t.Fatal("attempt 2 made no model request")
	}
	first := a2[0]
	n := len(first.Messages)
	if n < 3 {
		t.Fatalf("attempt 2's first request: %s", harnesstest.DescribeRequest(first))
	}
	call, out, user := first.Messages[n-3], first.Messages[n-2], first.Messages[n-1]
	if len(call.ToolCalls) != 1 || out.Role != "tool" || out.Content != "aborted" || out.ToolCallID != call.ToolCalls[0].ID || user.Role != "user" || user.Content != prompt {
		t.Errorf("attempt 2's first request ends with %+v, %+v, %+v; want the interrupted call, \"aborted\", the added turn", call, out, user)
	}
	if u := userTurns(first); len(u) != 2 || u[0] != task || u[1] != prompt {
		t.Errorf("attempt 2's user turns %q, want the task and %q", u, prompt)
	}
	harnesstest.CheckNoRepeats(t, append(slices.Clone(c.Attempt1), a2...))
	t.Logf("launch 2 reason %q; attempt 2 made %d model requests, the first ending with the interrupted call, %q and the added turn %q",
		l2.Reason, len(a2), out.Content, user.Content)
}
