package harnesstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	fakemodel "github.com/ngharness/ngharness/internal/fake/model"
	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver"
	"github.com/ngharness/ngharness/pkg/harness"
)

// Harness is what a real harness's e2e suite supplies to run the matrix
// every harness passes (PauseMidTool, PauseHeldReply, PauseMidStream,
// TwoRolloutsApart, CrashBeforeResponse, HostileTask, RunVerified): its own
// parts only. A suite fills one in and calls each body from a test of its
// own name: func TestXPauseMidTool(t *testing.T) { t.Parallel();
// harnesstest.PauseMidTool(t, kit) }.
type Harness struct {
	// Name names the harness in messages ("Codex").
	Name string
	// NewRig makes a world for t named name (in its folders and rollout)
	// whose fake model has the options model.
	NewRig func(t *testing.T, name string, model fakemodel.Options) Rig
	// Script is the fake model's script of one single-tool run: a tool call
	// running first in attempt 1 and again in later attempts, the final
	// text once a tool result is in (and an answer to whatever side
	// request the harness makes).
	Script func(first, again string) func(fakemodel.Request) fakemodel.Reply
	// NewParticipant is a participant for the harness's adapter (a new
	// one per attempt, as a driver process after a crash makes).
	NewParticipant func() *driver.Participant
	// ToolPrefix goes before every scripted command that sleeps (Claude
	// Code's Bash refuses a command that starts with sleep).
	ToolPrefix string
	// ToolShell is the command name of the shell a tool call runs in
	// ("bash"): PauseMidTool wants it paused, in a session and process
	// group of its own.
	ToolShell string
	// MainTurn tells the requests of the harness's main turn from its side
	// requests (OpenCode's title request); nil: every request is one.
	MainTurn func(fakemodel.Request) bool
	// SideRequests is how many side requests the harness makes before the
	// reply to its first main turn comes (OpenCode: the title).
	SideRequests int
	// FilesNote follows the count of unchanged files in the summary of two
	// looks at a paused launch (CompareStill): what the harness keeps among
	// them.
	FilesNote string
	// FreshReason is a part of the launch record's reason when a relaunch
	// starts over because the saved session holds no completed model
	// response ("... starting over with the task in a fresh CODEX_HOME").
	FreshReason string
	// SessionFile reports whether path, the session file a run's response
	// names, is where the harness keeps session id: in the rollout's state
	// folder.
	SessionFile func(id, path string) bool
}

// Rig is one world of a harness as the matrix drives it: the World and
// what the suite knows of its harness there.
type Rig struct {
	*World
	// Adapter is the harness's adapter of the world (its binary, the
	// world's fake model).
	Adapter func() harness.Adapter
	// MustSucceed waits for the run, which must be verified, checks what
	// the harness's own part of the result holds (its exit code, session,
	// final text, Gym reply) and returns what the matrix reads of it.
	MustSucceed func(h *Run) Finished
	// CheckOneToolRun checks the model requests of one completed
	// single-tool run of attempt (the task the only user turn byte for
	// byte, the call and its real result, none repeated) and returns a
	// summary.
	CheckOneToolRun func(reqs []fakemodel.Request, attempt int) string
}

// Finished is what the matrix reads of a verified run: the verdict, the
// launch log and the harness's session.
type Finished struct {
	Verdict
	// SessionID and SessionPath are the session the response names and
	// its file inside the sandbox ("" if the harness names none).
	SessionID, SessionPath string
}

// streamPace is the pause between the events of the streamed tool call in
// PauseMidStream: the stream (ten events or more) lasts several seconds.
const streamPace = time.Second

// mainTurns keeps the requests of the harness's main turn.
func (k Harness) mainTurns(reqs []fakemodel.Request) []fakemodel.Request {
	if k.MainTurn == nil {
		return reqs
	}
	var out []fakemodel.Request
	for _, r := range reqs {
		if k.MainTurn(r) {
			out = append(out, r)
		}
	}
	return out
}

// RunVerified: the real harness under the driver runs the task to a
// verified result (the owner's check finds done.txt): one launch,
// finished, exit 0; the model requests of one single-tool run on the
// rollout's prefix, the task the only user turn; the response names the
// session file in the rollout's state folder (and the suite's
// MustSucceed checks the final text and the Gym reply: the call, its
// output, the final message and the usage).
func RunVerified(t *testing.T, k Harness) {
	w := k.NewRig(t, "run", fakemodel.Options{Script: k.Script("touch done.txt", "touch done.txt")})
	h := w.Start(w.Runner(w.Adapter(), k.NewParticipant()), 1)
	r := w.MustSucceed(h)
	w.CheckOneLaunch(r.Launches, 0)
	if k.SessionFile != nil && !k.SessionFile(r.SessionID, r.SessionPath) {
		t.Errorf("session %s at %q, want the session file in the state folder", r.SessionID, r.SessionPath)
	}
	t.Logf("verified in one launch of %.1f s; %s", r.Launches[0].DurationS, w.CheckOneToolRun(w.Model.Requests(), 1))
}

// PauseMidTool: a checkpoint pauses the harness while its tool call runs
// `sleep`. Every process of the launch (the harness, the tool's shell in a
// session and process group of its own, sleep) is stopped; every file of
// the sandbox (the harness's session and database files among them) and
// every process's CPU time stay unchanged while the owner snapshots the
// sandbox and the checkpoint holds; no model request arrives. After the
// checkpoint opens the SAME harness process finishes (one launch, pauses
// 1), each model call made once, and the owner verifies done.txt.
func PauseMidTool(t *testing.T, k Harness) {
	w := k.NewRig(t, "midtool", fakemodel.Options{Script: k.Script(k.ToolPrefix+"sleep 15; touch done.txt", "touch done.txt")})
	p := k.NewParticipant()
	h := w.Start(w.Runner(w.Adapter(), p), 1)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	w.WaitProc(sb, l1, "sleep")
	hp := w.Harness(sb, l1)

	w.Prepare(p, "ck-1")
	nreq := len(w.Model.Requests())
	a := w.Observe(sb, l1)
	if _, ok := a.Procs[hp.PID]; !ok || !slices.Contains(Comms(a), "sleep") || !slices.Contains(Comms(a), k.ToolShell) {
		t.Fatalf("the paused launch holds %v (%s %d), want %s, the tool's %s and sleep", Comms(a), k.Name, hp.PID, k.Name, k.ToolShell)
	}
	tr, err := w.Suite.Tree(w.LaunchDir(sb, l1))
	if err != nil {
		t.Fatal(err)
	}
	var harnessSID int
	for _, q := range tr.Processes {
		if q.PID == hp.PID {
			harnessSID = q.SID
		}
	}
	for _, q := range tr.Processes {
		if q.Comm == k.ToolShell && (q.SID != q.PID || q.PGID != q.PID || q.SID == harnessSID) {
			t.Errorf("the tool's %s %d is in process group %d, session %d (%s's session %d): want a session and group of its own", k.ToolShell, q.PID, q.PGID, q.SID, k.Name, harnessSID)
		}
	}
	w.Commit(p, "ck-1")
	time.Sleep(Hold)
	b := w.Observe(sb, l1)
	t.Logf("paused mid-tool, processes (comm pid/ppid/pgid/sid) %s: %s", DescribeSessions(tr), CompareStill(t, a, b, k.FilesNote))
	if n := len(w.Model.Requests()); n != nreq {
		t.Errorf("%d model requests arrived while paused", n-nreq)
	}
	w.Resume(p, "ck-1")

	r := w.MustSucceed(h)
	w.CheckOneLaunch(r.Launches, 1)
	w.CheckSameHarnessFinished(sb, l1, hp)
	t.Logf("after continue: the same %s %d finished; %s", k.Name, hp.PID, w.CheckOneToolRun(w.Model.Requests(), 1))
}

// PauseHeldReply: a checkpoint pauses the harness while the model's reply
// to its first main turn is held (its side requests answered). The reply
// is released while the harness is paused: its bytes wait unread in the
// harness's socket, no tool runs, and nothing in the sandbox (files,
// database, CPU times) changes. After the checkpoint opens the harness
// reads that reply, runs the tool call it holds and finishes: one launch,
// pauses 1, the same process, no model call repeated.
func PauseHeldReply(t *testing.T, k Harness) {
	w := k.NewRig(t, "held", fakemodel.Options{Script: k.Script(k.ToolPrefix+"sleep 1; touch done.txt", "touch done.txt"), Holdable: k.MainTurn})
	w.Model.Hold(1)
	p := k.NewParticipant()
	h := w.Start(w.Runner(w.Adapter(), p), 1)
	w.WaitHeld(1)
	// Side requests go beside the main turn; let them be answered.
	want := 1 + k.SideRequests
	testkit.Eventually(w.T, "the side requests", func() (bool, string) {
		n := len(w.Model.Requests())
		return n >= want, fmt.Sprintf("%d requests", n)
	})
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	hp := w.Harness(sb, l1)
	port := w.ModelPort()

	a, base := w.PausedLook(p, "ck-1", sb, l1, port)
	queued := w.ReleaseSettled(port, base)
	time.Sleep(Hold)
	b := w.Observe(sb, l1)
	t.Logf("paused on the held reply, processes %v: %s", Comms(a), CompareStill(t, a, b, k.FilesNote))
	if slices.Contains(Comms(b), "sleep") {
		t.Errorf("the tool ran while paused")
	}
	if q, err := RxQueued(port); err != nil || q != queued {
		t.Errorf("%s's sockets held %d unread bytes from the model, then %d (%v): it read while paused", k.Name, queued, q, err)
	}
	if n := len(w.Model.Requests()); n != want {
		t.Errorf("%d model requests while paused, want the %d before it", n, want)
	}
	w.Resume(p, "ck-1")
	testkit.Eventually(w.T, k.Name+" reading the reply", func() (bool, string) {
		q, err := RxQueued(port)
		return err == nil && q <= base, fmt.Sprintf("%d bytes unread (%v)", q, err)
	})

	r := w.MustSucceed(h)
	w.CheckOneLaunch(r.Launches, 1)
	w.CheckSameHarnessFinished(sb, l1, hp)
	t.Logf("the reply (%d bytes) waited unread in %s's socket while paused and was read after continue; %s",
		queued-base, k.Name, w.CheckOneToolRun(w.Model.Requests(), 1))
}

// PauseMidStream: a checkpoint pauses the harness while the model's reply
// to its main turn (the tool call) is still streaming (the fake paces its
// events): the harness has the headers and the first events, and the rest
// keeps arriving while it is paused, waiting unread in its socket (the
// queued bytes grow, then stay the same once the stream has ended);
// nothing in the sandbox (files, database, CPU times) changes and no tool
// runs. After the checkpoint opens the harness reads the rest of the
// stream, runs the tool call and finishes: one launch, pauses 1, the same
// process, no model call repeated.
func PauseMidStream(t *testing.T, k Harness) {
	paced := k.Script("touch done.txt", "touch done.txt")
	w := k.NewRig(t, "midstream", fakemodel.Options{Script: func(r fakemodel.Request) fakemodel.Reply {
		rep := paced(r)
		if rep.ToolCall != nil {
			rep.Pace = streamPace
		}
		return rep
	}})
	p := k.NewParticipant()
	h := w.Start(w.Runner(w.Adapter(), p), 1)
	testkit.Eventually(w.T, "the main turn's request", func() (bool, string) {
		n := len(k.mainTurns(w.Model.Requests()))
		return n >= 1, fmt.Sprintf("%d main-turn requests", n)
	})
	// The first events go out at once; pause within the paced rest.
	time.Sleep(streamPace + streamPace/2)
	sb := w.WaitSandbox(1)
	l1 := w.LaunchID(1, 1, sb)
	hp := w.Harness(sb, l1)
	port := w.ModelPort()
	since := func(at time.Time) time.Duration {
		return at.Sub(k.mainTurns(w.Model.Requests())[0].Received).Round(time.Millisecond)
	}

	paused := time.Now()
	a, base := w.PausedLook(p, "ck-1", sb, l1, port)
	// The rest of the stream arrives while the harness is paused: the
	// bytes queued for it grow, then stay the same once it has ended.
	queued, changed := base, time.Now()
	for deadline := paused.Add(30 * streamPace); queued == base || time.Since(changed) < 2*streamPace; time.Sleep(100 * time.Millisecond) {
		q, err := RxQueued(port)
		if err != nil {
			t.Fatal(err)
		}
		if q != queued {
			queued, changed = q, time.Now()
		}
		if queued == base && time.Now().After(deadline) {
			t.Fatalf("no byte of the stream arrived in %s of pause: it had ended before the pause took (%s after the main turn's request); the machine is too slow for this test",
				30*streamPace, since(paused))
		}
	}
	time.Sleep(Hold)
	b := w.Observe(sb, l1)
	t.Logf("paused mid-stream (%s after the main turn's request), processes %v: %s", since(paused), Comms(a), CompareStill(t, a, b, k.FilesNote))
	if slices.Contains(Comms(b), "touch") {
		t.Errorf("the tool ran while paused")
	}
	if n, want := len(w.Model.Requests()), 1+k.SideRequests; n != want {
		t.Errorf("%d model requests by the end of the pause, want the %d before it", n, want)
	}
	w.Resume(p, "ck-1")

	r := w.MustSucceed(h)
	w.CheckOneLaunch(r.Launches, 1)
	w.CheckSameHarnessFinished(sb, l1, hp)
	t.Logf("%d bytes of the stream arrived unread while paused (%d queued at the pause) and were read after continue; %s",
		queued-base, base, w.CheckOneToolRun(w.Model.Requests(), 1))
}

// TwoRolloutsApart: two rollouts run the harness at once, each in its own
// sandbox. A checkpoint of one pauses its processes only: the other's
// harness, tool and sleep are none of the first's paused processes and
// keep running (none stopped), and it finishes while the first is held;
// then the first continues and finishes too.
func TwoRolloutsApart(t *testing.T, k Harness) {
	wa := k.NewRig(t, "twoa", fakemodel.Options{Script: k.Script(k.ToolPrefix+"sleep 20; touch done.txt", "touch done.txt")})
	wb := k.NewRig(t, "twob", fakemodel.Options{Script: k.Script(k.ToolPrefix+"sleep 15; touch done.txt", "touch done.txt")})
	pa, pb := k.NewParticipant(), k.NewParticipant()
	ha := wa.Start(wa.Runner(wa.Adapter(), pa), 1)
	hb := wb.Start(wb.Runner(wb.Adapter(), pb), 1)
	sa, sb := wa.WaitSandbox(1), wb.WaitSandbox(1)
	la, lb := wa.LaunchID(1, 1, sa), wb.LaunchID(1, 1, sb)
	wa.WaitProc(sa, la, "sleep")
	wb.WaitProc(sb, lb, "sleep")

	wa.Prepare(pa, "ck-a")
	a := wa.Observe(sa, la)
	trb, err := wb.Suite.Tree(wb.LaunchDir(sb, lb))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range trb.Processes {
		if _, ok := a.Procs[q.PID]; ok {
			t.Errorf("process %d (%s) of rollout B is among rollout A's paused processes", q.PID, q.Comm)
		}
		if st, ok := proctest.ReadStat(q.PID); ok && (st.State == 'T' || st.State == 't') {
			t.Errorf("process %d (%s) of rollout B is stopped while A is paused", q.PID, q.Comm)
		}
	}
	rb := wb.MustSucceed(hb) // B finishes while A is held
	wb.CheckOneLaunch(rb.Launches, 0)
	wa.Commit(pa, "ck-a")
	wa.Resume(pa, "ck-a")
	ra := wa.MustSucceed(ha)
	wa.CheckOneLaunch(ra.Launches, 1)
	t.Logf("A paused (%d processes %v) while B's %d processes ran on and B finished; then A finished: %s",
		len(a.Procs), Comms(a), len(trb.Processes), wa.CheckOneToolRun(wa.Model.Requests(), 1))
}

// CrashBeforeResponse: the driver crashes after a checkpoint taken while
// the harness's first main-turn request is held (no completed response
// saved). The relaunch in the fork starts over (resumed false, the reason
// naming the missing response and the fresh start, FreshReason), makes
// the model calls of one single-tool run with the task the only user
// turn, and is verified.
func CrashBeforeResponse(t *testing.T, k Harness) {
	w := k.NewRig(t, "noresp", fakemodel.Options{Script: k.Script("touch done.txt", "touch done.txt"), Holdable: k.MainTurn})
	w.Model.Hold(1)
	p1 := k.NewParticipant()
	h1 := w.Start(w.Runner(w.Adapter(), p1), 1)
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

	p2 := k.NewParticipant()
	w.Restore(p2, "ck-1", ck)
	h2 := w.Start(w.Runner(w.Adapter(), p2), 2)
	r := w.MustSucceed(h2)
	w.Model.Release() // attempt 1's request, whose client is gone
	if len(r.Launches) != 2 {
		t.Fatalf("%d launches, want 2: %+v", len(r.Launches), r.Launches)
	}
	l1, l2 := r.Launches[0], r.Launches[1]
	if l1.SandboxID != old || l1.Outcome != driver.OutcomeInterrupted {
		t.Errorf("launch 1: %+v; want in %s, interrupted", l1, old)
	}
	if l2.SandboxID != fork || l2.Resumed || l2.Outcome != driver.OutcomeFinished || !strings.Contains(l2.Reason, k.FreshReason) {
		t.Errorf("launch 2: %+v; want in the fork %s, not resumed (no completed response), finished, the reason saying %q", l2, fork, k.FreshReason)
	}
	t.Logf("launch 2 reason %q; %s", l2.Reason, w.CheckOneToolRun(ByAttempt(w.Model.Requests(), 2), 2))
}

// HostileText is a task of about 100 KB that a shell would mangle: a
// leading dash, quotes of both kinds, $(...), backticks, ${...}, a
// backslash before n, tabs, newlines inside and at the end, and text
// outside ASCII. Its substitutions, run, would create pwned-* files.
func HostileText() string {
	head := "-- --json '\"$(touch pwned-dollar)\"' `touch pwned-tick` ${HOME} \\n \t; echo \"x\" > pwned-redirect\n" +
		"naïve — 中文 🙂 %s %d \x01\r\nthen run the tool\n"
	var b strings.Builder
	b.WriteString(head)
	for i := 0; b.Len() < 100*1024; i++ {
		fmt.Fprintf(&b, "line %d: 'single' \"double\" $(date) `uname` $((1+1)) \\ \\\\ \n", i)
	}
	b.WriteString("end\n")
	return b.String()
}

// HostileTask: a hostile task (HostileText) reaches the model byte for
// byte as the only user turn (the suite's CheckOneToolRun), runs nothing
// it names (no pwned-* file anywhere in the sandbox), and the run is
// verified.
func HostileTask(t *testing.T, k Harness) {
	w := k.NewRig(t, "hostile", fakemodel.Options{Script: k.Script("touch done.txt", "touch done.txt")})
	w.Task = HostileText()
	h := w.Start(w.Runner(w.Adapter(), k.NewParticipant()), 1)
	r := w.MustSucceed(h)
	w.CheckOneLaunch(r.Launches, 0)
	summary := w.CheckOneToolRun(w.Model.Requests(), 1)
	for _, id := range w.Sandboxes() {
		_ = filepath.WalkDir(w.Local.HostPath(id), func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.HasPrefix(d.Name(), "pwned") {
				t.Errorf("the task ran a command: %s exists", p)
			}
			return nil
		})
	}
	t.Logf("a %d-byte hostile task reached the model byte for byte; %s", len(w.Task), summary)
}

// CheckNoRepeats fails the test if any request carried the history of an
// earlier one (fakemodel.Request.HistoryKey).
func CheckNoRepeats(t *testing.T, reqs []fakemodel.Request) {
	t.Helper()
	seen := map[string]int{}
	for i, r := range reqs {
		k := r.HistoryKey()
		if j, ok := seen[k]; ok {
			t.Errorf("model request %d repeats request %d: %s", i+1, j+1, DescribeRequest(r))
		}
		seen[k] = i
	}
}
