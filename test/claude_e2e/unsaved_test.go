package claudee2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/claude"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/test/fakemodel"
)

// Claude Code saves its session lazily: each entry is queued, and the
// queue is appended to the session file by a timer 100 ms later (its
// FLUSH_INTERVAL_MS), on a worker thread, while the model's reply is
// printed on stdout at once and its tool call starts. A checkpoint can
// pause it in between. These tests make that moment certain by holding
// the session file's writes (harnesstest.WriteHold) while the reply comes.

// sessionGlob is where a sandbox's Claude Code sessions are, below its
// host folder.
func sessionGlob(root string) string {
	return filepath.Join(root, local.RootFolder, "state", "claude", "*", "config", "projects", "*", "*.jsonl")
}

// sessionFile is the one session file of a sandbox (host path).
func (w *world) sessionFile(sandboxID string) string {
	w.T.Helper()
	files, _ := filepath.Glob(sessionGlob(w.Local.HostPath(sandboxID)))
	if len(files) != 1 {
		w.T.Fatalf("session files in sandbox %s: %v, want one", sandboxID, files)
	}
	return files[0]
}

// waitSessionHolds waits until the sandbox's session file holds text,
// and returns its path.
func (w *world) waitSessionHolds(sandboxID, text string) string {
	w.T.Helper()
	var file string
	w.Eventually(fmt.Sprintf("%s in the session file", text), func() (bool, string) {
		files, _ := filepath.Glob(sessionGlob(w.Local.HostPath(sandboxID)))
		for _, f := range files {
			if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), text) {
				file = f
				return true, ""
			}
		}
		return false, fmt.Sprintf("session files %v", files)
	})
	return file
}

// checkUnsaved checks the moment the hold makes: Claude Code has printed
// the model's reply calling the tool with cmd on its stdout (the launch
// folder's stdout file) and the tool runs, but its session file holds no
// such call, and its write of it waits on the hold.
func (w *world) checkUnsaved(sandboxID, launchID string, hold *harnesstest.WriteHold, cmd string) {
	w.T.Helper()
	out, err := os.ReadFile(filepath.Join(w.LaunchDir(sandboxID, launchID), proto.StdoutFile))
	if err != nil || !strings.Contains(string(out), `{"type":"assistant"`) || !strings.Contains(string(out), cmd) {
		w.T.Fatalf("launch %s's stdout (%v) has no assistant message calling %q:\n%s", launchID, err, cmd, out)
	}
	w.Eventually(hold.String()+" holding a write", func() (bool, string) { return hold.Waiting(), "no write waits" })
	data, err := os.ReadFile(w.sessionFile(sandboxID))
	if err != nil || strings.Contains(string(data), cmd) {
		w.T.Fatalf("the session file (%v) already holds the call of %q: the hold did not catch Claude Code's write", err, cmd)
	}
}

// snapshotSession is the session saved in the one snapshot of snaps.
func (w *world) snapshotSession(snaps map[string]string) *claude.Session {
	w.T.Helper()
	if len(snaps) != 1 {
		w.T.Fatalf("snapshots %v, want one", snaps)
	}
	var files []string
	for _, id := range snaps {
		files, _ = filepath.Glob(sessionGlob(w.Local.SnapshotPath(id)))
	}
	if len(files) != 1 {
		w.T.Fatalf("session files in the snapshot: %v, want one", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		w.T.Fatal(err)
	}
	s, err := claude.ParseSession(data)
	if err != nil {
		w.T.Fatalf("the snapshot's session: %v", err)
	}
	return s
}

// TestClaudeCrashReplyUnsaved: the model's reply calling the Bash tool
// comes, Claude Code prints it on stdout and runs the tool, but its
// session file does not hold it yet when a checkpoint pauses the launch
// (its writes are held from the moment the task is saved until the
// snapshot is taken); then the driver crashes. The relaunch in the fork
// must not ask the model again for the reply it had given: the adapter
// adds the printed reply to the saved session and continues it, so
// attempt 2's first request is attempt 1's, the call and Claude Code's
// interrupted result (no request repeated), and the run is verified.
func TestClaudeCrashReplyUnsaved(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "unsaved", fakemodel.Options{Script: script("echo start; sleep 25; touch done.txt", "touch done.txt")})
	w.Model.Hold(1)
	var hold *harnesstest.WriteHold
	ready := func(sandboxID, launchID string) {
		w.WaitHeld(1)
		hold = w.HoldWrites(w.waitSessionHolds(sandboxID, `"type":"user"`))
		w.Model.Release()
		w.WaitProc(sandboxID, launchID, "sleep")
		w.checkUnsaved(sandboxID, launchID, hold, "echo start")
	}
	c := w.crashAfterSnapshot(ready, func(sandboxID, launchID string) {
		hold.Release()
		w.WaitProc(sandboxID, launchID, "sleep")
	})
	if ok, why := c.saved.Continuable(task); ok || len(c.saved.Responses()) != 0 {
		t.Fatalf("the saved session: continuable %v (%s), %d responses; want the task with the reply unsaved", ok, why, len(c.saved.Responses()))
	}
	r := w.relaunch(c)
	l2 := r.Launches[1]
	if !l2.Resumed || !strings.Contains(l2.Reason, "holds 1 completed model response; continuing it") ||
		!strings.Contains(l2.Reason, "the interrupted tool call with Claude Code's interrupted result (no turn added)") ||
		!strings.Contains(l2.Reason, "1 entry Claude Code had sent or received but not yet saved") {
		t.Errorf("launch 2: resumed %v, reason %q; want resumed at the interrupted call, the reply recovered from stdout", l2.Resumed, l2.Reason)
	}
	first := w.checkContinued(c, true, func(m fakemodel.Message) bool { return isInterrupted(m) && m.Content == claude.InterruptedText })
	if a2 := harnesstest.ByAttempt(w.Model.Requests(), 2); len(a2) != 2 {
		t.Errorf("attempt 2 made %d model requests, want 2 (the call again, the final)", len(a2))
	}
	if r.Response.SessionID != c.saved.ID {
		t.Errorf("attempt 2 ended in session %s, want the saved %s continued", r.Response.SessionID, c.saved.ID)
	}
	t.Logf("launch 2 reason %q; attempt 2's first request: %s", l2.Reason, harnesstest.DescribeRequest(first))
}

// TestClaudeCrashTwiceReplyUnsaved is the CI failure of
// TestClaudeCrashTwiceResumes made certain (crashTwice, unsaved): attempt
// 2's launch continues the session, sends its request and gets the reply
// calling the tool again, prints it and runs the tool, but saves neither
// the message it sent nor the reply before ck-2 pauses it. Attempt 3 must
// continue from what attempt 2 had, not repeat attempt 2's request.
func TestClaudeCrashTwiceReplyUnsaved(t *testing.T) {
	t.Parallel()
	crashTwice(t, "twiceunsaved", true)
}
