package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestRunSupervisorIsSubreaper proves that the supervisor is the child
// subreaper: a daemon the harness double-forked (its parent exited at once)
// is re-parented to the supervisor named by the DetachResult, not to init.
func TestRunSupervisorIsSubreaper(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-daemon"))
	daemon := l.role("daemon")
	testkit.Eventually(t, "the daemon to be re-parented to the supervisor", func() (bool, string) {
		st, err := readStat(daemon.PID)
		if err != nil {
			return false, err.Error()
		}
		return st.PPID == l.Sup.PID, "ppid " + itoa(st.PPID) + ", supervisor " + itoa(l.Sup.PID)
	})
	sup, err := readStat(l.Sup.PID)
	if err != nil || sup.Start != l.Sup.StartTicks {
		t.Fatalf("supervisor %d (start %d) not found: %v %+v", l.Sup.PID, l.Sup.StartTicks, err, sup)
	}
	if d, _ := readStat(daemon.PID); d.SID == sup.SID {
		t.Errorf("the daemon should be in a session of its own, it shares the supervisor's (%d)", sup.SID)
	}
}

// TestRunHarnessOwnProcessGroup proves that the harness leads a session and
// a process group of its own (sid == pgid == harness pid), which are not the
// supervisor's, and that the receipt records the group.
func TestRunHarnessOwnProcessGroup(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness"))
	h := l.role("harness")
	st, err := readStat(h.PID)
	if err != nil {
		t.Fatal(err)
	}
	sup, err := readStat(l.Sup.PID)
	if err != nil {
		t.Fatal(err)
	}
	if st.PGID != h.PID {
		t.Errorf("harness %d is in process group %d, want its own", h.PID, st.PGID)
	}
	if st.PGID == sup.PGID {
		t.Errorf("harness shares the supervisor's process group %d", sup.PGID)
	}
	if st.SID != h.PID || st.SID == sup.SID {
		t.Errorf("harness %d is in session %d (the supervisor's is %d), want its own", h.PID, st.SID, sup.SID)
	}
	if st.PPID != l.Sup.PID {
		t.Errorf("harness's parent is %d, want the supervisor %d", st.PPID, l.Sup.PID)
	}
	rc := l.status()
	if rc.HarnessPID != h.PID || rc.HarnessPGID != h.PID || rc.HarnessStartTicks != h.Start {
		t.Errorf("receipt names harness %d pgid %d start %d, want %d %d %d", rc.HarnessPID, rc.HarnessPGID, rc.HarnessStartTicks, h.PID, h.PID, h.Start)
	}
	if rc.SupervisorPID != l.Sup.PID || rc.SupervisorStartTicks != l.Sup.StartTicks {
		t.Errorf("receipt names supervisor %d@%d, DetachResult %d@%d", rc.SupervisorPID, rc.SupervisorStartTicks, l.Sup.PID, l.Sup.StartTicks)
	}
}

// TestRunTagsEveryProcess proves that NEMO_GYM_HARNESS_LAUNCH=<id> is in the
// environment of the harness and of everything it starts: a child in its own
// process group, one in a session of its own, a double-forked daemon. The
// child that cleared its environment is the control: it must not carry it.
func TestRunTagsEveryProcess(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid", "-daemon", "-noenv"))
	tag := proto.TagEnv + "=" + l.ID
	for _, role := range []string{"harness", "bg", "setsid", "daemon"} {
		p := l.role(role)
		if !environHas(p.PID, tag) {
			t.Errorf("%s (pid %d) does not carry %s", role, p.PID, tag)
		}
	}
	if p := l.role("noenv"); environHas(p.PID, tag) {
		t.Errorf("the fixture is wrong: noenv (pid %d) carries the tag", p.PID)
	}
	if environHas(l.Sup.PID, tag) {
		t.Errorf("the supervisor itself carries the tag")
	}
}

// TestRunReceiptLifecycle proves that the receipt says started and not ended
// while the harness runs (and `wait --timeout` exits 3 then), and ended with
// the harness's exit code, with the end time, afterwards (`wait` exits 0).
func TestRunReceiptLifecycle(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	release := filepath.Join(l.Rec, "release")
	l.detach(nil, helper("harness", "-until", release, "-exit", "5"))
	h := l.role("harness")
	// The supervisor writes "started" once the harness runs: the harness
	// may record its pid first.
	if hp := l.harness(); hp != h {
		t.Errorf("the receipt names the harness %v, the harness is %v", hp, h)
	}
	rc := l.status()
	if !rc.Started || rc.Ended || rc.ID != l.ID || rc.HarnessPID != h.PID || rc.StartedAt.IsZero() {
		t.Errorf("while running, the receipt says %+v", rc)
	}
	r := l.verb("wait", "--timeout", "200ms")
	wantCode(t, r, 3)
	var w proto.Receipt
	r.json(t, &w)
	if w.Ended {
		t.Errorf("wait --timeout on a running launch printed an ended receipt: %+v", w)
	}
	touchFile(t, release)
	rc = l.wait()
	if rc.ExitCode != 5 || rc.Signal != 0 || !rc.Started || rc.EndedAt.IsZero() || rc.EndedAt.Before(rc.StartedAt) {
		t.Errorf("after the end, the receipt says %+v", rc)
	}
	if st := l.status(); st.ExitCode != 5 || !st.Ended {
		t.Errorf("status after the end says %+v", st)
	}
}

// TestRunForegroundExitCode proves that a foreground `ngsup run` exits with
// the harness's exit code: 7 for exit 7, 143 for death by SIGTERM, 127 for a
// command that does not exist; and that the receipt agrees.
func TestRunForegroundExitCode(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		cmd    func() command
		code   int
		signal int
	}{
		{"exit7", func() command { return helper("harness", "-exit", "7") }, 7, 0},
		{"sigterm", func() command { return helper("harness", "-term") }, 143, 15},
		{"notfound", func() command { return plain("/nonexistent/ngsup-e2e-no-such-command") }, 127, 0},
		{"notfound-path", func() command { return plain("ngsup-e2e-no-such-command") }, 127, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := newLaunch(t)
			r := l.foreground(nil, c.cmd())
			wantCode(t, r, c.code)
			rc := l.status()
			if !rc.Ended || rc.ExitCode != c.code || rc.Signal != c.signal {
				t.Errorf("receipt: ended %v exit_code %d signal %d, want true %d %d (%+v)", rc.Ended, rc.ExitCode, rc.Signal, c.code, c.signal, rc)
			}
			if c.code == 127 && (rc.Started || !strings.Contains(rc.Error, "ngsup-e2e-no-such-command")) {
				t.Errorf("a command not found: receipt should say not started and name it: %+v", rc)
			}
		})
	}
}

// TestRunCleansUpProcessGroup proves that when the harness exits, what it
// left in its process group (a background sleep) is killed, and the receipt
// says cleanup_confirmed.
func TestRunCleansUpProcessGroup(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	release := filepath.Join(l.Rec, "release")
	l.detach(nil, helper("harness", "-bg", "-until", release, "-exit", "0"))
	h, bg := l.role("harness"), l.role("bg")
	if st, err := readStat(bg.PID); err != nil || st.PGID != h.PID {
		t.Fatalf("fixture: bg should be in the harness's group %d: %+v %v", h.PID, st, err)
	}
	touchFile(t, release)
	rc := l.wait()
	if rc.ExitCode != 0 || !rc.CleanupConfirmed || rc.Error != "" {
		t.Errorf("receipt: exit %d cleanup_confirmed %v error %q, want 0 true \"\"", rc.ExitCode, rc.CleanupConfirmed, rc.Error)
	}
	testkit.Eventually(t, "the background sleep to be gone", func() (bool, string) {
		return !alive(bg), "bg " + bg.String() + " alive"
	})
}

// TestRunStopFileBeforeStart proves that a stop file present before the
// start (`ngsup stop` on an empty folder) means nothing starts: the harness's
// marker never appears and the receipt says ended, not started.
func TestRunStopFileBeforeStart(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	r := l.verb("stop")
	wantCode(t, r, 0)
	var sr proto.StopResult
	r.json(t, &sr)
	if !sr.Stopped {
		t.Errorf("stop on an empty folder: %+v", sr)
	}
	if !exists(filepath.Join(l.Dir, proto.StopFile)) {
		t.Fatalf("stop on an empty folder left no stop file")
	}
	marker := filepath.Join(l.Rec, "marker")
	l.detach(nil, helper("harness", "-marker", marker, "-exit", "0"))
	rc := l.wait()
	if rc.Started || !rc.Ended || rc.HarnessPID != 0 {
		t.Errorf("receipt: started %v ended %v harness %d, want false true 0", rc.Started, rc.Ended, rc.HarnessPID)
	}
	time.Sleep(300 * time.Millisecond)
	if exists(marker) {
		t.Errorf("the harness ran despite the stop file")
	}
	if len(l.recorded()) != 0 || len(l.tagged()) != 0 {
		t.Errorf("processes of the launch exist: %v %v", l.recorded(), l.tagged())
	}
}

// TestRunPauseFileBeforeStart proves that a pause file present before the
// start (`ngsup pause` on an empty folder) holds the launch: the harness has
// not started after some hundreds of ms, and once `continue` removes the
// file it starts and runs to its end.
func TestRunPauseFileBeforeStart(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	r := l.verb("pause")
	wantCode(t, r, 0)
	var pr proto.PauseResult
	r.json(t, &pr)
	if !pr.Paused || pr.Processes != 0 {
		t.Errorf("pause on an empty folder: %+v", pr)
	}
	marker := filepath.Join(l.Rec, "marker")
	l.detach(nil, helper("harness", "-marker", marker, "-exit", "0"))
	time.Sleep(500 * time.Millisecond)
	if exists(marker) {
		t.Fatalf("the harness started while the pause file was there")
	}
	if rc := l.status(); rc.Started || rc.Ended {
		t.Fatalf("while held: receipt %+v", rc)
	}
	if !alive(proc{l.Sup.PID, l.Sup.StartTicks}) {
		t.Fatalf("the supervisor should wait, it is gone")
	}
	l.resume()
	rc := l.wait()
	if !rc.Started || rc.ExitCode != 0 {
		t.Errorf("after continue: %+v", rc)
	}
	if !exists(marker) {
		t.Errorf("the harness never ran")
	}
	if exists(filepath.Join(l.Dir, proto.PauseFile)) {
		t.Errorf("continue left the pause file")
	}
}

// TestRunStdin proves that `ngsup run --stdin FILE` gives the harness FILE
// as its stdin, byte for byte (a NUL, no final newline), detached (its
// output in D/stdout) and in the foreground (ngsup's own stdout); without
// --stdin a detached harness reads an empty /dev/null; and that a
// relative or unreadable --stdin is a usage error naming it, with nothing
// started.
func TestRunStdin(t *testing.T) {
	t.Parallel()
	input := "line one\n{\"type\":\"user\"}\x00 last, no newline"
	file := filepath.Join(t.TempDir(), "input")
	if err := os.WriteFile(file, []byte(input), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("detached", func(t *testing.T) {
		t.Parallel()
		l := newLaunch(t)
		l.detach([]string{"--stdin", file}, plain("cat"))
		if rc := l.wait(); rc.ExitCode != 0 {
			t.Fatalf("cat exited %d: %+v", rc.ExitCode, rc)
		}
		if got, err := os.ReadFile(filepath.Join(l.Dir, proto.StdoutFile)); err != nil || string(got) != input {
			t.Errorf("the harness read %q (%v), want %q", got, err, input)
		}
	})
	t.Run("detached-devnull", func(t *testing.T) {
		t.Parallel()
		l := newLaunch(t)
		l.detach(nil, plain("cat"))
		if rc := l.wait(); rc.ExitCode != 0 {
			t.Fatalf("cat exited %d: %+v", rc.ExitCode, rc)
		}
		if got, err := os.ReadFile(filepath.Join(l.Dir, proto.StdoutFile)); err != nil || len(got) != 0 {
			t.Errorf("without --stdin the harness read %q (%v), want nothing", got, err)
		}
	})
	t.Run("foreground", func(t *testing.T) {
		t.Parallel()
		l := newLaunch(t)
		r := l.foreground([]string{"--stdin", file}, plain("cat"))
		wantCode(t, r, 0)
		if r.stdout != input {
			t.Errorf("the harness read %q, want %q", r.stdout, input)
		}
	})
	for _, bad := range []struct{ name, path, want string }{
		{"relative", "input", "not an absolute path"},
		{"missing", filepath.Join(t.TempDir(), "none"), "no such file"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			t.Parallel()
			l := newLaunch(t)
			r := l.foreground([]string{"--stdin", bad.path}, plain("cat"))
			wantCode(t, r, 2)
			if !strings.Contains(r.stderr, "--stdin") || !strings.Contains(r.stderr, bad.want) {
				t.Errorf("stderr %q, want it to name --stdin and say %q", r.stderr, bad.want)
			}
			if _, err := os.Stat(filepath.Join(l.Dir, proto.ReceiptFile)); err == nil {
				t.Errorf("a receipt was written: the launch started")
			}
		})
	}
}
