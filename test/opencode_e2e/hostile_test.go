package opencodee2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/harnesstest"
	"github.com/ngharness/ngharness/pkg/driver/sandbox/local"
)

// hostileLine is one line of the hostile task: quotes of both kinds, a
// command substitution and backticks that would each create a file in the
// workdir if a shell ran them, a glob, variables, backslashes, a percent
// verb, a tab, a carriage return and non-ASCII.
const hostileLine = `it's "quoted" $(touch injected-dollar) ` + "`touch injected-backtick`" +
	` ; rm -rf ./* # \ \\ \n %s %% ${HOME} $PATH 'single' -- --format x` + "\t\r tab ✓ ünïcode"

// hostileSize is how long the hostile task is, at least.
const hostileSize = 100 << 10

// hostileTask is a task of over hostileSize bytes made of hostile lines,
// starting and ending with text (no whitespace at either end).
func hostileTask() string {
	var b strings.Builder
	b.WriteString("Fix the bug: ")
	for b.Len() < hostileSize {
		b.WriteString(hostileLine + "\n")
	}
	b.WriteString("end of task")
	return b.String()
}

// TestHostileTaskReachesModel: a task of over 100 KB full of shell syntax
// (quotes, $(...), backticks, globs, variables, backslashes, newlines, a
// tab, a carriage return, non-ASCII) goes through the driver and the
// adapter to OpenCode and reaches the model byte for byte as the main
// turn's one user message; none of it runs (no file its substitutions
// would create exists); OpenCode saved it exactly (the session export's
// first user message); the run is verified; and a later resume decision on
// the saved session reads it back whole and finds the session starts with
// the task.
func TestHostileTaskReachesModel(t *testing.T) {
	t.Parallel()
	forEachOpenCode(t, testHostileTaskReachesModel)
}

func testHostileTaskReachesModel(t *testing.T, ver openCode) {
	w := newWorld(t, ver, "hostile", fakemodel.Options{Script: script("touch done.txt", "touch done.txt")})
	w.Task = hostileTask()
	h := w.Start(w.Runner(w.adapter(nil), newParticipant()), 1)
	r := w.mustSucceed(h)
	sb := w.Sandboxes()[0]

	mains := mainTurns(harnesstest.ByAttempt(w.Model.Requests(), 1))
	if len(mains) != 2 {
		t.Fatalf("%d main-turn model requests, want the tool call and the final", len(mains))
	}
	for i, q := range mains {
		var users []fakemodel.Message
		for _, m := range q.Messages {
			if m.Role == "user" {
				users = append(users, m)
			}
		}
		if len(users) != 1 || users[0].Content != w.Task || len(users[0].Parts) != 1 || users[0].Parts[0] != w.Task {
			var got []string
			for _, u := range users {
				got = append(got, firstDiff(u.Content, w.Task))
			}
			t.Errorf("main-turn request %d holds %d user messages (%v), want the task alone, byte for byte", i+1, len(users), got)
		}
	}
	for _, name := range []string{"injected-dollar", "injected-backtick"} {
		if _, err := os.Stat(filepath.Join(w.Local.HostPath(sb), local.WorkFolder, name)); err == nil {
			t.Errorf("%s exists in the workdir: the task text ran in a shell", name)
		}
	}
	saved := parseSession(t, r.Response.Session)
	if users := saved.users(); len(users) != 1 || !strings.HasSuffix(users[0], " "+w.Task) {
		t.Errorf("the session export holds %d user messages, want the task alone, byte for byte", len(users))
	}
	lent, state := w.savedState(sb)
	d, err := w.adapter(nil).ResumeDecision(context.Background(), lent, state, w.Rollout, 2)
	if err != nil || !d.Resume || !strings.Contains(d.Reason, "starts with the task") {
		t.Errorf("the resume decision on the saved session: %+v (%v); want it continued, the session starting with the task", d, err)
	}
	t.Logf("a %d-byte hostile task (%d lines) reached the model byte for byte in %d main-turn requests, ran nowhere, was saved exactly; resume decision: %q",
		len(w.Task), strings.Count(w.Task, "\n")+1, len(mains), d.Reason)
}

// firstDiff describes where got first differs from want.
func firstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	if i == len(got) && i == len(want) {
		return "equal"
	}
	lo := max(0, i-20)
	return fmt.Sprintf("%d bytes (want %d), first difference at byte %d: got %q, want %q",
		len(got), len(want), i, got[lo:min(len(got), i+20)], want[lo:min(len(want), i+20)])
}
