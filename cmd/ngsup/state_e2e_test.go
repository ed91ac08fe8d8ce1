package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
	"github.com/ngharness/ngharness/pkg/reaper"
)

// inState is a launch folder built in one state for the table test.
type inState struct {
	l   *launch
	dir string // the folder the verbs are given (a copy's, for copied)
	id  string // --id for pause, continue and stop ("" for none)
	// procs are the launch's processes: held by a pause when held is set,
	// running otherwise.
	procs map[string]proc
	held  bool
}

// sleeper is the harness of the table test's launches: one sleep, no
// fixture, no cgroup.
var sleeper = plain("/bin/sleep", "1000")

// buildState makes a launch folder in state st, with real processes where
// the state needs them: a live supervisor (pending, running, paused), a
// dead one (orphaned, copied), a tagged process of the test's own (tagged).
func buildState(t *testing.T, st reaper.State) inState {
	t.Helper()
	l := newLaunch(t)
	s := inState{l: l, dir: l.Dir, procs: map[string]proc{}}
	mkdir := func() {
		if err := os.MkdirAll(l.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	noCgroup := []string{"--no-cgroup"}
	sup := func() proc { return proc{l.Sup.PID, l.Sup.StartTicks} }
	switch st {
	case reaper.Missing:
	case reaper.Empty:
		mkdir()
	case reaper.Unreadable:
		mkdir()
		if err := os.WriteFile(filepath.Join(l.Dir, proto.ReceiptFile), []byte("not a receipt\x00\xff"), 0o644); err != nil {
			t.Fatal(err)
		}
	case reaper.Tagged:
		mkdir()
		cmd := exec.Command("/bin/sleep", "1000")
		cmd.Env = append(baseEnv(), proto.TagEnv+"="+l.ID)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		pst, err := readStat(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		s.procs["tagged"] = proc{cmd.Process.Pid, pst.Start}
		l.own(s.procs["tagged"])
		s.id = l.ID
	case reaper.NeverStarted:
		l.detach(noCgroup, plain("/nonexistent/ngsup-e2e-state"))
		l.wait()
	case reaper.Ended, reaper.Copied:
		l.detach(noCgroup, plain("/bin/sh", "-c", "exit 0"))
		l.wait()
		wantGone(t, map[string]proc{"supervisor": sup()})
		if st == reaper.Copied {
			s.dir = filepath.Join(t.TempDir(), "copy")
			if out, err := exec.Command("cp", "-a", "-T", l.Dir, s.dir).CombinedOutput(); err != nil {
				t.Fatalf("copy the launch folder: %v: %s", err, out)
			}
		}
	case reaper.Pending:
		wantCode(t, l.verb("pause"), 0)
		l.detach(noCgroup, sleeper)
		s.procs["supervisor"] = sup()
		// A stop of a pending launch holds the folder's lock, which the
		// waiting supervisor needs to see the stop file: it takes the
		// stop's whole kill budget and settle time (7 s) to end it. The
		// stop cell pays that once; the others end their supervisor
		// first (it runs before the launch's cleanup), by pid and start
		// time.
		t.Cleanup(func() {
			if p := s.procs["supervisor"]; alive(p) {
				unix.Kill(p.PID, unix.SIGKILL)
			}
		})
	case reaper.Running, reaper.Paused, reaper.Orphaned:
		l.detach(noCgroup, sleeper)
		s.procs["harness"] = l.harness()
		switch st {
		case reaper.Paused:
			l.pause()
			s.held = true
		case reaper.Orphaned:
			if err := unix.Kill(l.Sup.PID, unix.SIGKILL); err != nil {
				t.Fatal(err)
			}
			wantGone(t, map[string]proc{"supervisor": sup()})
		}
	default:
		t.Fatalf("no builder for state %s", st)
	}
	return s
}

// wantAsBuilt fails the test unless every process of s is as it was built:
// held by the pause, or running.
func (s inState) wantAsBuilt(t *testing.T, after string) {
	t.Helper()
	if s.held {
		wantHeld(t, s.procs)
		return
	}
	for _, name := range sortedKeys(s.procs) {
		if ok, why := running(s.procs[name]); !ok {
			t.Errorf("%s after %s: %s", name, after, why)
		}
	}
}

// verbLine is the command line of verb on s, with --id where the verb
// takes one and s has one.
func (s inState) verbLine(v reaper.Verb, withID bool) []string {
	args := []string{v.String(), "--dir", s.dir}
	switch v {
	case reaper.VerbRun:
		args = []string{"run", "--detach", "--no-cgroup", "--dir", s.dir, "--id", s.l.ID, "--", "/bin/sh", "-c", "exit 0"}
	case reaper.VerbWait:
		args = append(args, "--timeout", "200ms")
	case reaper.VerbStop:
		args = append(args, "--grace", "0s")
	case reaper.VerbTree:
		args = append(args, "--json")
	}
	if withID && s.id != "" {
		args = append(args, "--id", s.id)
	}
	return args
}

// wantRefused checks a "cannot X in state Y" refusal: the cell's code, one
// line on stderr naming the state, nothing on stdout, and the processes as
// they were.
func wantRefused(t *testing.T, r outcome, st reaper.State, c reaper.Cell, s inState) {
	t.Helper()
	if r.code != c.Exit[0] {
		t.Fatalf("want exit %d:\n%v", c.Exit[0], r)
	}
	msg := strings.TrimRight(r.stderr, "\n")
	if !strings.HasPrefix(msg, "ngsup: cannot ") || !strings.Contains(msg, " a launch in state "+st.String()+": ") || strings.Contains(msg, "\n") {
		t.Errorf("stderr does not say it cannot act in state %s, in one line:\n%v", st, r)
	}
	if r.stdout != "" {
		t.Errorf("a refusal printed on stdout:\n%v", r)
	}
	s.wantAsBuilt(t, "a refusal")
}

// TestVerbStateTable proves that every verb does in every state what the
// transition table (pkg/reaper/transitions.go, docs/ngsup.md) says: for each
// cell a launch folder is built in the state, the verb is run, and its exit
// code is one the cell names and its effect the cell's action: a refusal
// names the state and touches nothing, a verb that only writes its file
// leaves every process as it was, a verb that acts pauses, continues,
// ends, waits for, prints or lists, and stop of a copy searches nothing.
func TestVerbStateTable(t *testing.T) {
	t.Parallel()
	for _, st := range reaper.States {
		for _, v := range reaper.Verbs {
			c := reaper.Transition(v, st)
			if c.Do == reaper.NotSeen {
				continue
			}
			t.Run(st.String()+"/"+v.String(), func(t *testing.T) {
				t.Parallel()
				s := buildState(t, st)
				checkCell(t, s, st, v, c)
			})
		}
	}
}

// checkCell runs verb v on s and checks that it did what c says.
func checkCell(t *testing.T, s inState, st reaper.State, v reaper.Verb, c reaper.Cell) {
	t.Helper()
	switch c.Do {
	case reaper.CreateWithID, reaper.ByTagWithID:
		// Without --id: refused, the folder as it was.
		had, before := exists(s.dir), dirNames(s.dir)
		receipt := readFile(filepath.Join(s.dir, proto.ReceiptFile))
		wantRefused(t, ngsup(t, s.verbLine(v, false)...), st, reaper.Cell{Exit: []int{proto.ExitUsage}}, s)
		if has, after := exists(s.dir), dirNames(s.dir); has != had || strings.Join(after, " ") != strings.Join(before, " ") {
			t.Errorf("a refused %s changed the folder (there: %v, %v) to (%v, %v)", v, had, before, has, after)
		}
		// With it: taken for a launch without a receipt, found by its tag.
		s.id = s.l.ID
		r := ngsup(t, s.verbLine(v, true)...)
		wantExit(t, r, c)
		if !exists(s.dir) {
			t.Errorf("%s --id left no folder", v)
		}
		if got := readFile(filepath.Join(s.dir, proto.ReceiptFile)); !bytes.Equal(got, receipt) {
			t.Errorf("%s --id changed the receipt", v)
		}
		if v == reaper.VerbStop {
			var res proto.StopResult
			r.json(t, &res)
			if !res.Stopped || !strings.Contains(res.ReceiptError, "receipt") {
				t.Errorf("stop --id of an unreadable receipt: %+v", res)
			}
		}
		return
	case reaper.Refuse:
		if v == reaper.VerbPause && c.Exit[0] == proto.ExitEnded {
			r := ngsup(t, s.verbLine(v, true)...)
			wantExit(t, r, c)
			var res proto.PauseResult
			r.json(t, &res)
			if !res.Ended || res.Paused || exists(filepath.Join(s.dir, proto.PauseFile)) {
				t.Errorf("pause of an ended launch: %+v", res)
			}
			return
		}
		wantRefused(t, ngsup(t, s.verbLine(v, true)...), st, c, s)
		return
	}
	r := ngsup(t, s.verbLine(v, true)...)
	wantExit(t, r, c)
	switch c.Do {
	case reaper.Nothing:
		var res proto.StopResult
		r.json(t, &res)
		if !res.Copied || !res.Stopped || len(res.Searched) != 0 || res.Interrupted+res.Killed != 0 {
			t.Errorf("stop of a copy: %+v", res)
		}
	case reaper.File, reaper.Create:
		checkFileOnly(t, s, v, r)
	case reaper.Act:
		checkActed(t, s, st, v, r)
	default:
		t.Fatalf("no check for action %d", c.Do)
	}
}

// wantExit fails the test unless r's exit code is one c names.
func wantExit(t *testing.T, r outcome, c reaper.Cell) {
	t.Helper()
	for _, code := range c.Exit {
		if r.code == code {
			return
		}
	}
	t.Fatalf("want exit in %v:\n%v", c.Exit, r)
}

// checkFileOnly checks a verb that only writes or removes its file: the
// folder exists, the file is there (pause, stop) or gone (continue), the
// reply names no process, and every process runs as it did. run made from a
// missing folder has started.
func checkFileOnly(t *testing.T, s inState, v reaper.Verb, r outcome) {
	t.Helper()
	switch v {
	case reaper.VerbRun:
		if rc := s.l.status(); rc.ID != s.l.ID {
			t.Errorf("run into a missing folder: receipt %+v", rc)
		}
		return
	// Method "none": no process was searched for.
	case reaper.VerbPause:
		var res proto.PauseResult
		r.json(t, &res)
		if !res.Paused || res.Processes != 0 || res.Method != proto.MethodNone || !exists(filepath.Join(s.dir, proto.PauseFile)) {
			t.Errorf("pause: %+v, pause file %v", res, exists(filepath.Join(s.dir, proto.PauseFile)))
		}
	case reaper.VerbContinue:
		var res proto.ContinueResult
		r.json(t, &res)
		if res.Continued != 0 || res.Method != proto.MethodNone || exists(filepath.Join(s.dir, proto.PauseFile)) {
			t.Errorf("continue: %+v, pause file %v", res, exists(filepath.Join(s.dir, proto.PauseFile)))
		}
	case reaper.VerbStop:
		var res proto.StopResult
		r.json(t, &res)
		if !res.Stopped || res.Interrupted+res.Killed != 0 || res.Method != proto.MethodNone || len(res.Searched) != 0 || !exists(filepath.Join(s.dir, proto.StopFile)) {
			t.Errorf("stop: %+v, stop file %v", res, exists(filepath.Join(s.dir, proto.StopFile)))
		}
	}
	s.wantAsBuilt(t, v.String())
	// A pause or stop that only leaves its file starts nothing (a continue
	// that removes the pause file lets a waiting run start: its purpose).
	if rc, err := proto.ReadReceipt(s.dir); err == nil && rc.Started && v != reaper.VerbContinue {
		t.Errorf("%s started the harness of a launch it only held: %+v", v, rc)
	}
}

// checkActed checks a verb that did its work on the launch.
func checkActed(t *testing.T, s inState, st reaper.State, v reaper.Verb, r outcome) {
	t.Helper()
	switch v {
	case reaper.VerbRun:
		if rc := s.l.status(); rc.ID != s.l.ID {
			t.Errorf("run: receipt %+v", rc)
		}
	case reaper.VerbWait, reaper.VerbStatus:
		var rc proto.Receipt
		r.json(t, &rc)
		if rc.ID != s.l.ID || v == reaper.VerbWait && (r.code == proto.ExitOK) != rc.Ended {
			t.Errorf("%s: exit %d, receipt %+v", v, r.code, rc)
		}
	case reaper.VerbTree:
		var tr proto.TreeResult
		r.json(t, &tr)
		for name, p := range s.procs {
			found := false
			for _, q := range tr.Processes {
				found = found || q.PID == p.PID
			}
			if !found {
				t.Errorf("tree does not list %s %v: %+v", name, p, tr)
			}
		}
	case reaper.VerbPause:
		var res proto.PauseResult
		r.json(t, &res)
		if !res.Paused || res.Processes < len(s.procs) || res.Method == proto.MethodNone {
			t.Errorf("pause: %+v, want %d processes held", res, len(s.procs))
		}
		wantHeld(t, s.procs)
	case reaper.VerbContinue:
		var res proto.ContinueResult
		r.json(t, &res)
		if res.Method == proto.MethodNone || st == reaper.Paused && res.Continued < len(s.procs) {
			t.Errorf("continue: %+v", res)
		}
		waitRunning(t, s.procs)
	case reaper.VerbStop:
		var res proto.StopResult
		r.json(t, &res)
		if !res.Stopped || res.Copied || res.Method == proto.MethodNone {
			t.Errorf("stop: %+v", res)
		}
		wantGone(t, s.procs)
		if rc, err := proto.ReadReceipt(s.dir); err == nil && !rc.Ended {
			t.Errorf("after the stop the receipt records no end: %+v", rc)
		}
	}
}
