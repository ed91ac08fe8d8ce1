package opencodee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/proto"
)

// crashed is what crashAfterSnapshot leaves: the sandbox attempt 1 ran in,
// the fork the restore made, the snapshot, the committed records, the
// session saved in the snapshot, and the model requests of attempt 1.
type crashed struct {
	harnesstest.Crash
	saved session
}

// crashAfterSnapshot runs attempt 1 until ready (the moment to checkpoint),
// checkpoints it (pause, the owner's snapshot, commit, continue), lets it
// go on, then crashes the driver (the run is cancelled with
// driver.ErrCrashed: nothing is cleaned up), while the same state lasts
// (the tool still runs, or the reply is still held). The owner restores
// the checkpoint: it stops every launch of the old sandbox and forks the
// snapshot under a new sandbox id.
func (w *world) crashAfterSnapshot(env map[string]string, ready, lasts func(sandboxID, launchID string)) crashed {
	t := w.T
	t.Helper()
	c := crashed{Crash: w.CrashAfterSnapshot(w.adapter(env), newParticipant(), ready, lasts)}
	c.saved = w.exportSaved(w.Local.SnapshotPath(c.Snapshot))
	return c
}

// relaunch restores the committed records into a new participant (a new
// driver after the crash) and runs attempt 2, which must be verified.
func (w *world) relaunch(c crashed, env map[string]string, during func()) result {
	w.T.Helper()
	p2 := newParticipant()
	w.Restore(p2, "ck-1", c.Committed)
	h2 := w.Start(w.Runner(w.adapter(env), p2), 2)
	if during != nil {
		during()
	}
	r := w.mustSucceed(h2)
	w.CheckRelaunch(r.Launches, c.Crash)
	return r
}

// toolWaits is the readiness of the tool-call crashes: the tool's sleep
// runs in the launch.
func (w *world) toolWaits(sandboxID, launchID string) { w.WaitProc(sandboxID, launchID, "sleep") }

// toolStillRuns checks the crash comes during the same tool call.
func (w *world) toolStillRuns(sandboxID, launchID string) {
	w.T.Helper()
	tr, err := suite.Tree(w.LaunchDir(sandboxID, launchID))
	if err != nil {
		w.T.Fatal(err)
	}
	for _, p := range tr.Processes {
		if p.Comm == "sleep" {
			return
		}
	}
	w.T.Fatalf("the tool call ended before the crash: %s", harnesstest.DescribeTree(tr))
}

// checkResumedTurn checks a relaunch that continued the saved session
// through ngresume: resumed=true; ngresume was the harness and re-entered
// the saved user turn; the model saw the interrupted tool result in
// exactly one new main-turn request, no request repeated one attempt 1 got
// an answer to, and no user message was added to the session.
func (w *world) checkResumedTurn(c crashed, r result) {
	t := w.T
	t.Helper()
	l2 := r.Launches[1]
	if !l2.Resumed || !strings.Contains(l2.Reason, "starts with the task and holds") {
		t.Errorf("launch 2: resumed %v, reason %q; want resumed, the session starting with the task and holding a model response", l2.Resumed, l2.Reason)
	}
	rc := w.Receipt(c.Fork, l2.ID)
	if len(rc.Command) == 0 || !strings.HasPrefix(filepath.Base(rc.Command[0]), "ngresume-") || !slices.Contains(rc.Command, w.oc) {
		t.Errorf("launch 2 ran %q, want the uploaded ngresume with --opencode %s", rc.Command, w.oc)
	}
	out, err := os.ReadFile(filepath.Join(w.LaunchDir(c.Fork, l2.ID), proto.StdoutFile))
	if err != nil {
		t.Fatal(err)
	}
	var rs struct {
		SessionID            string `json:"session_id"`
		ContinuedFrom        string `json:"continued_from"`
		UserMessages         int    `json:"user_messages"`
		NewAssistantMessages int    `json:"new_assistant_messages"`
		FinalText            string `json:"final_text"`
	}
	if err := json.Unmarshal(out, &rs); err != nil {
		t.Fatalf("ngresume printed %q: %v", out, err)
	}
	savedUsers := c.saved.users()
	if len(savedUsers) != 1 || !strings.HasSuffix(savedUsers[0], " "+task) {
		t.Fatalf("the saved session's user messages are %q, want the task alone", savedUsers)
	}
	userID, _, _ := strings.Cut(savedUsers[0], " ")
	if rs.SessionID != c.saved.Info.ID || rs.ContinuedFrom != userID || rs.UserMessages != 1 || rs.NewAssistantMessages < 1 || rs.FinalText != finalText {
		t.Errorf("ngresume: %+v; want session %s continued from user message %s, 1 user message, new assistant messages, final %q",
			rs, c.saved.Info.ID, userID, finalText)
	}

	// The model's side.
	a1 := c.Attempt1
	if len(a1) != 2 || len(mainTurns(a1)) != 1 {
		t.Errorf("attempt 1 made %d model requests, %d with tools; want the title and the tool call", len(a1), len(mainTurns(a1)))
	}
	if n := len(harnesstest.ByAttempt(w.Model.Requests(), 1)); n != len(a1) {
		t.Errorf("attempt 1's OpenCode made %d more model requests after the crash", n-len(a1))
	}
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	checkNoRepeats(t, append(slices.Clone(a1), a2...))
	var interrupted []fakemodel.Request
	for _, q := range mainTurns(a2) {
		last := q.LastMessage()
		if last.Role == "tool" && strings.Contains(last.Content, "interrupted") {
			interrupted = append(interrupted, q)
		}
		if last.Role == "user" {
			t.Errorf("attempt 2 sent a new user turn: %s", harnesstest.DescribeRequest(q))
		}
	}
	if len(interrupted) != 1 {
		t.Fatalf("attempt 2 made %d main-turn requests ending with the interrupted tool result, want exactly 1", len(interrupted))
	}
	q := interrupted[0]
	if n := len(q.Messages); n < 3 || len(q.Messages[n-2].ToolCalls) != 1 || q.Messages[n-2].ToolCalls[0].ID != q.LastMessage().ToolCallID ||
		q.Messages[n-2].ToolCalls[0].ID != c.saved.toolCallID() {
		t.Errorf("the resumed request does not end with attempt 1's tool call and its interrupted result: %+v", q.Messages)
	}
	firstUser := ""
	for _, m := range q.Messages {
		if m.Role == "user" {
			if firstUser != "" {
				t.Errorf("the resumed request holds a second user message %q", m.Content)
			}
			firstUser = m.Content
		}
	}
	if firstUser != task {
		t.Errorf("the resumed request's user message is %q, want the task %q", firstUser, task)
	}

	// The session's side: the fork's database, read on the host, and the
	// export the adapter handed to verify.
	after := w.exportSaved(w.Local.HostPath(c.Fork))
	if handed := parseSession(t, r.Response.Session); handed.Info.ID != after.Info.ID || len(handed.Messages) != len(after.Messages) {
		t.Errorf("the response holds session %s with %d messages, the fork's database %s with %d", handed.Info.ID, len(handed.Messages), after.Info.ID, len(after.Messages))
	}
	if after.Info.ID != c.saved.Info.ID || !slices.Equal(after.users(), savedUsers) {
		t.Errorf("after the relaunch: session %s, user messages %q; want session %s with exactly %q", after.Info.ID, after.users(), c.saved.Info.ID, savedUsers)
	}
	t.Logf("saved in the snapshot: %s", c.saved.describe())
	t.Logf("after the relaunch: %s", after.describe())
	var lines []string
	for _, q := range a2 {
		lines = append(lines, harnesstest.DescribeRequest(q))
	}
	t.Logf("launch 2 (%s): %s; ngresume: %+v; attempt 1 made %d model requests, attempt 2 %d: %s",
		l2.Reason, strings.Join(rc.Command, " "), rs, len(a1), len(a2), strings.Join(lines, " | "))
}

// TestCrashResumesSavedTurn: a checkpoint is committed while OpenCode's
// bash tool call sleeps, then the driver crashes during that same tool
// call. After the restore the fork of the snapshot is relaunched: the
// adapter decides to resume (resumed=true), ngresume runs as the harness
// and re-enters the saved user turn, the model sees the interrupted tool
// result in exactly one new request (no request repeats one attempt 1 got
// an answer to), no user message is added, and the run is verified.
func TestCrashResumesSavedTurn(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testCrashResumesSavedTurn)
}

func testCrashResumesSavedTurn(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "crash", fakemodel.Options{Script: script("sleep 120; touch done.txt", "touch done.txt")})
	c := w.crashAfterSnapshot(nil, w.toolWaits, w.toolStillRuns)
	w.checkResumedTurn(c, w.relaunch(c, nil, nil))
}

// TestCrashNoModelResponse: the checkpoint is committed while OpenCode's
// first main-turn reply is held, so the saved session holds the user
// message (and the title) but no completed model response; the driver then
// crashes. The relaunch in the fork starts fresh and says so
// (resumed=false, "... holds no completed model response ..."): a new
// `opencode run` with the task in a new data folder, which the model
// answers from the start, and the run is verified.
func TestCrashNoModelResponse(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testCrashNoModelResponse)
}

func testCrashNoModelResponse(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "noreply", fakemodel.Options{
		Script:   script("sleep 1; touch done.txt", "touch done.txt"),
		Holdable: func(r fakemodel.Request) bool { return r.HasTools },
	})
	w.Model.Hold(1)
	held := func(string, string) {
		w.WaitHeld(1)
		testkit.Eventually(w.T, "the title request", func() (bool, string) {
			n := len(w.Model.Requests())
			return n >= 2, fmt.Sprintf("%d requests", n)
		})
	}
	stillHeld := func(string, string) {
		if w.Model.Held() != 1 {
			w.T.Fatalf("the main turn is no longer held")
		}
	}
	c := w.crashAfterSnapshot(nil, held, stillHeld)
	if got := c.saved.completedAssistants(); got != 0 || len(c.saved.users()) != 1 {
		t.Fatalf("the saved session holds %d user messages and %d completed model responses, want 1 and 0: %s",
			len(c.saved.users()), got, c.saved.describe())
	}
	r := w.relaunch(c, nil, nil)
	l2 := r.Launches[1]
	if l2.Resumed || !strings.Contains(l2.Reason, "holds no completed model response") || !strings.Contains(l2.Reason, "starting over") {
		t.Errorf("launch 2: resumed %v, reason %q; want a fresh start because the session holds no completed model response", l2.Resumed, l2.Reason)
	}
	if rc := w.Receipt(c.Fork, l2.ID); len(rc.Command) < 4 || rc.Command[0] != "/bin/sh" || rc.Command[3] != w.oc {
		t.Errorf("launch 2 ran %q, want a fresh `opencode run`", rc.Command)
	}
	a2 := harnesstest.ByAttempt(w.Model.Requests(), 2)
	checkNoRepeats(t, a2)
	mains := mainTurns(a2)
	if len(a2) != 3 || len(mains) != 2 || mains[0].LastMessage().Role != "user" || mains[0].LastMessage().Content != task {
		t.Errorf("attempt 2 made %d model requests (%d with tools), want title, the task's main turn, final", len(a2), len(mains))
	}
	after := parseSession(t, r.Response.Session)
	if after.Info.ID == c.saved.Info.ID || len(after.users()) != 1 {
		t.Errorf("after the relaunch: session %s with user messages %q; want a new session (not %s) holding the task once",
			after.Info.ID, after.users(), c.saved.Info.ID)
	}
	t.Logf("saved: %s; launch 2: resumed=%v %q; new %s; attempt 2 made %d model requests", c.saved.describe(), l2.Resumed, l2.Reason, after.describe(), len(a2))
}

// pythonStub is a python3 of 3.6, as SWE-bench testbeds put first on
// PATH: it reports its version, and fails on anything else the way 3.6
// fails on `from __future__ import annotations`. Every call is logged.
const pythonStub = `#!/bin/sh
echo "python3 $*" >> "$(dirname "$0")/calls.log"
case "$1" in
-V|--version) echo "Python 3.6.13"; exit 0 ;;
esac
echo '  File "<stdin>", line 1' >&2
echo 'SyntaxError: future feature annotations is not defined' >&2
exit 1
`

// TestCrashResumeWithOldPython: as TestCrashResumesSavedTurn, with a
// python3 of 3.6 (a stub failing on `from __future__ import annotations`)
// first on PATH, given to OpenCode through the adapter's Env option on
// both attempts. The relaunch still resumes the saved turn through
// ngresume (whose environment has the stub first on PATH) and is verified.
func TestCrashResumeWithOldPython(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testCrashResumeWithOldPython)
}

func testCrashResumeWithOldPython(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "python36", fakemodel.Options{Script: script("sleep 120; touch done.txt", "touch done.txt")})
	stub := t.TempDir()
	if err := os.WriteFile(filepath.Join(stub, "python3"), []byte(pythonStub), 0o755); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"PATH": stub + ":" + os.Getenv("PATH")}
	c := w.crashAfterSnapshot(env, w.toolWaits, w.toolStillRuns)

	// In the fork, with OpenCode's environment, python3 is the stub.
	sb, err := w.Local.Open(c.Fork)
	if err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(context.Background(), sandbox.ExecRequest{
		Argv: []string{"python3", "-c", "from __future__ import annotations"}, Env: env,
	})
	if err != nil || res.ExitCode != 1 || !strings.Contains(string(res.Stderr), "future feature annotations is not defined") {
		t.Fatalf("python3 in the fork: exit %d (%v), stderr %q; want the stub's SyntaxError", res.ExitCode, err, res.Stderr)
	}

	var helperPath string
	during := func() {
		l2 := w.LaunchID(2, 2, c.Fork)
		testkit.Eventually(w.T, "ngresume running in the relaunch", func() (bool, string) {
			tr, err := suite.Tree(w.LaunchDir(c.Fork, l2))
			if err != nil {
				return false, err.Error()
			}
			for _, p := range tr.Processes {
				if strings.HasPrefix(p.Comm, "ngresume") {
					helperPath, _ = proctest.Env(p.PID, "PATH")
					return helperPath != "", "no PATH read"
				}
			}
			return false, harnesstest.DescribeTree(tr)
		})
	}
	r := w.relaunch(c, env, during)
	w.checkResumedTurn(c, r)
	if !strings.HasPrefix(helperPath, stub+":") {
		t.Errorf("ngresume ran with PATH %q, want the stub's folder %s first", helperPath, stub)
	}
	calls, _ := os.ReadFile(filepath.Join(stub, "calls.log"))
	t.Logf("python3 3.6 stub first on PATH of ngresume (PATH=%.60s...); calls to the stub: %q (the test's own check only)", helperPath, calls)
}
