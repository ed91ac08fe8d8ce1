package reaper

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/proto"
)

// stateFor opens dir for verb v as the verb's entry does (under the lock for
// the control verbs) and returns the state it derived, or the state named by
// its refusal. Any other error fails the test.
func stateFor(t *testing.T, v Verb, dir, id string) State {
	t.Helper()
	lock := v == VerbPause || v == VerbContinue || v == VerbStop
	l, st, unlock, _, err := openFor(v, dir, id, lock)
	var se *StateError
	if errors.As(err, &se) {
		if se.Verb != v || !strings.Contains(err.Error(), "cannot "+v.phrase()+" a launch in state "+se.State.String()) {
			t.Errorf("%s refused with %q (verb %s)", v, err, se.Verb)
		}
		return se.State
	}
	if err != nil {
		t.Fatalf("%s on %s: %v", v, dir, err)
	}
	if unlock != nil {
		unlock()
	}
	if l == nil {
		t.Fatalf("%s on %s: no launch and no error", v, dir)
	}
	return st
}

// wantState fails the test unless verb v (with id) finds dir in state want.
func wantState(t *testing.T, v Verb, dir, id string, want State) {
	t.Helper()
	if got := stateFor(t, v, dir, id); got != want {
		t.Errorf("%s finds %s in state %s, want %s", v, dir, got, want)
	}
}

// copyFolder copies a launch folder as a snapshot of the sandbox does
// (cp -a: the files, not the folder's identity).
func copyFolder(t *testing.T, dir string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", "-T", dir, dst).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v: %s", dir, err, out)
	}
	return dst
}

var (
	// sleepTree is a harness that execs one sleep.
	sleepTree = benchTree{name: "state-sleep", script: "exec sleep 3600\n", processes: 1}
	// exitTree is a harness that exits 0 at once.
	exitTree = benchTree{name: "state-exit", script: "exit 0\n"}
)

// TestStateWithoutProcesses proves the derivation of the states that need no
// process: a missing folder, an unreadable receipt (refused, or with stop
// --id taken for a launch without one), an empty folder, and one named by
// --id.
func TestStateWithoutProcesses(t *testing.T) {
	root := t.TempDir()
	missing := filepath.Join(root, "missing")
	for _, v := range []Verb{VerbWait, VerbStatus, VerbTree, VerbContinue} {
		wantState(t, v, missing, "", Missing)
	}
	if exists(missing) {
		t.Errorf("a verb that refuses a missing folder made it")
	}

	bad := filepath.Join(root, "bad")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, proto.ReceiptFile), []byte("not a receipt\xff"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, v := range []Verb{VerbWait, VerbStatus, VerbTree, VerbPause, VerbContinue, VerbStop} {
		wantState(t, v, bad, "", Unreadable)
	}
	wantState(t, VerbPause, bad, "state-bad", Unreadable)
	// stop --id goes on by the tag: the launch is then one without a
	// receipt, and ReceiptErr says why.
	l, st, unlock, _, err := openFor(VerbStop, bad, "state-bad", true)
	if err != nil {
		t.Fatalf("stop --id on an unreadable receipt: %v", err)
	}
	unlock()
	if st != Tagged || !errors.Is(l.ReceiptErr, proto.ErrCorruptReceipt) {
		t.Errorf("stop --id on an unreadable receipt: state %s, receipt error %v; want tagged, corrupt", st, l.ReceiptErr)
	}

	empty := filepath.Join(root, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, v := range []Verb{VerbWait, VerbStatus, VerbTree, VerbPause, VerbContinue, VerbStop} {
		wantState(t, v, empty, "", Empty)
	}
	// A pause or stop file does not change it: no verb tells those apart.
	touchPause(t, empty)
	wantState(t, VerbPause, empty, "", Empty)
	for _, v := range []Verb{VerbPause, VerbContinue, VerbStop} {
		wantState(t, v, empty, "state-tagged", Tagged)
	}
	// pause and stop make a missing folder, then find it empty.
	for _, v := range []Verb{VerbPause, VerbStop} {
		dir := filepath.Join(root, "made-by-"+v.String())
		wantState(t, v, dir, "", Empty)
	}
	wantState(t, VerbContinue, filepath.Join(root, "made-by-continue"), "state-tagged", Tagged)
}

func touchPause(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, proto.PauseFile), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStateOfRealLaunches proves the derivation on launch folders made by a
// real supervisor (this test binary as the helper of bench_test.go) and real
// harnesses: pending (held by a pause file, and still so once its
// supervisor is killed), running, paused, orphaned (its supervisor killed,
// with the pause file or without), ended, never started (a command that
// cannot be found), and copies: a copy of an ended launch is copied to
// stop and ended to every other verb; a copy of a running launch, whose
// supervisor lives, is not copied.
func TestStateOfRealLaunches(t *testing.T) {
	t.Run("pending", func(t *testing.T) {
		t.Parallel()
		bl := startSupervised(t, sleepTree, launchOptions{cgroupFD: -1, noCgroup: true, pauseFirst: true})
		for _, v := range []Verb{VerbWait, VerbStatus, VerbTree, VerbPause, VerbContinue, VerbStop} {
			wantState(t, v, bl.dir, "", Pending)
		}
		bl.helper.Process.Kill()
		bl.helper.Wait()
		wantState(t, VerbPause, bl.dir, "", Pending)
		wantState(t, VerbStop, bl.dir, "", Pending)
	})
	t.Run("running-paused-orphaned", func(t *testing.T) {
		t.Parallel()
		bl := startSupervised(t, sleepTree, launchOptions{cgroupFD: -1, noCgroup: true})
		bl.waitBuilt(t, sleepTree.processes, time.Minute)
		for _, v := range []Verb{VerbWait, VerbStatus, VerbTree, VerbPause, VerbContinue, VerbStop} {
			wantState(t, v, bl.dir, "", Running)
		}
		wantState(t, VerbStop, copyFolder(t, bl.dir), "", Running)
		if _, code, err := Pause(bl.dir, PauseOptions{}); code != proto.ExitOK || err != nil {
			t.Fatalf("pause: %d %v", code, err)
		}
		for _, v := range []Verb{VerbWait, VerbPause, VerbContinue, VerbStop} {
			wantState(t, v, bl.dir, "", Paused)
		}
		bl.helper.Process.Kill()
		bl.helper.Wait()
		for _, v := range []Verb{VerbWait, VerbPause, VerbContinue, VerbStop} {
			wantState(t, v, bl.dir, "", Orphaned)
		}
		if _, code, err := Continue(bl.dir); code != proto.ExitOK || err != nil {
			t.Fatalf("continue: %d %v", code, err)
		}
		wantState(t, VerbPause, bl.dir, "", Orphaned)
	})
	t.Run("ended-copied", func(t *testing.T) {
		t.Parallel()
		bl := startSupervised(t, exitTree, launchOptions{cgroupFD: -1, noCgroup: true})
		if _, code, err := Wait(bl.dir, 0); code != proto.ExitOK || err != nil {
			t.Fatalf("wait: %d %v", code, err)
		}
		bl.helper.Wait() // the supervisor is gone, so nothing the copy names runs
		for _, v := range []Verb{VerbWait, VerbStatus, VerbTree, VerbPause, VerbContinue, VerbStop} {
			wantState(t, v, bl.dir, "", Ended)
		}
		cp := copyFolder(t, bl.dir)
		wantState(t, VerbStop, cp, "", Copied)
		for _, v := range []Verb{VerbWait, VerbStatus, VerbTree, VerbPause, VerbContinue} {
			wantState(t, v, cp, "", Ended)
		}
	})
	t.Run("never-started", func(t *testing.T) {
		t.Parallel()
		bl := startSupervised(t, exitTree, launchOptions{cgroupFD: -1, noCgroup: true, command: []string{"/nonexistent/ngsup-state-test"}})
		r, code, err := Wait(bl.dir, 0)
		if code != proto.ExitOK || err != nil || r.Started || r.ExitCode != proto.ExitExecNotFound {
			t.Fatalf("wait: %d %v %+v", code, err, r)
		}
		for _, v := range []Verb{VerbWait, VerbStatus, VerbTree, VerbPause, VerbContinue, VerbStop} {
			wantState(t, v, bl.dir, "", NeverStarted)
		}
	})
}

// TestRunStateRefusal proves that run refuses a folder holding a receipt in
// any state, naming the state: an unreadable receipt and one of a launch
// that never started, with the contract's class (exit 2).
func TestRunStateRefusal(t *testing.T) {
	dir := t.TempDir()
	if got := runState(dir); got != Empty {
		t.Fatalf("run finds an empty folder %s", got)
	}
	if err := os.WriteFile(filepath.Join(dir, proto.ReceiptFile), []byte{}, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := runState(dir); got != Unreadable {
		t.Errorf("run finds an empty receipt %s, want unreadable", got)
	}
	r := &proto.Receipt{ID: "state-run", Command: []string{"x"}, SupervisorPID: 1, SupervisorStartTicks: 1, Ended: true, ExitCode: -1}
	if err := proto.WriteReceipt(dir, r); err != nil {
		t.Fatal(err)
	}
	if got := runState(dir); got != NeverStarted {
		t.Errorf("run finds %s, want never-started", got)
	}
	_, err := Supervise(RunOptions{Dir: dir, ID: "state-run", Command: []string{"/bin/true"}})
	var se *StateError
	if !errors.As(err, &se) || se.Verb != VerbRun || se.State != NeverStarted || !errors.Is(err, proto.ErrLaunchExists) {
		t.Errorf("run into a folder holding a launch: %v", err)
	}
}

// TestTableInDocs proves that docs/ngsup.md shows the transition table the
// verbs act by, cell for cell.
func TestTableInDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "ngsup.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), TableMarkdown()) {
		t.Errorf("docs/ngsup.md does not hold the transition table as the code has it; it should read:\n%s", TableMarkdown())
	}
}

// TestTableIsWhole proves that every cell of the table is filled in: each
// verb either never finds a launch in a state or says what it does there and
// with which exit codes; a refusal has exactly one; and the verbs without
// --id never find a launch tagged.
func TestTableIsWhole(t *testing.T) {
	for _, v := range Verbs {
		for _, s := range States {
			c := Transition(v, s)
			switch {
			case c.Do == NotSeen && (len(c.Exit) != 0 || c.Note != ""):
				t.Errorf("%s in %s: not seen, yet exit %v %q", v, s, c.Exit, c.Note)
			case c.Do != NotSeen && (len(c.Exit) == 0 || c.Note == ""):
				t.Errorf("%s in %s: no exit codes or note", v, s)
			case c.Do == Refuse && len(c.Exit) != 1:
				t.Errorf("%s in %s: a refusal with exit codes %v", v, s, c.Exit)
			}
		}
	}
	for _, v := range []Verb{VerbRun, VerbWait, VerbStatus, VerbTree} {
		if Transition(v, Tagged).Do != NotSeen {
			t.Errorf("%s takes no --id, yet its row has tagged", v)
		}
	}
	if len(States) != int(numStates) || len(Verbs) != int(numVerbs) {
		t.Errorf("States or Verbs leaves one out")
	}
}
