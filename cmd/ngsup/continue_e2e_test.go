package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestContinueResumesExactlyWhatPauseStopped proves that continue resumes
// the launch's processes and nothing else: a process the test started and
// stopped itself, outside the launch, stays stopped even when its pid is
// written into the launch's paused file with another start time; every
// process of the launch runs again and the pause file is gone.
func TestContinueResumesExactlyWhatPauseStopped(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid", "-daemon"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid", "daemon"} {
		procs[role] = l.role(role)
	}
	other := l.startOwn("/bin/sleep", "1000")
	if err := unix.Kill(other.PID, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the unrelated process to stop", func() (bool, string) {
		st, _ := readStat(other.PID)
		return st.State == 'T', fmt.Sprintf("state %c", st.State)
	})
	l.pause()
	wantHeld(t, procs)
	paused := filepath.Join(l.Dir, proto.PausedFile)
	f, err := os.OpenFile(paused, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("pause left no %s: %v", proto.PausedFile, err)
	}
	fmt.Fprintf(f, "%d %d\n", other.PID, other.Start+1)
	f.Close()
	res := l.resume()
	if res.Continued < len(procs) {
		t.Errorf("continue says it continued %d processes, want at least %d: %+v", res.Continued, len(procs), res)
	}
	waitRunning(t, procs)
	time.Sleep(200 * time.Millisecond)
	if st, err := readStat(other.PID); err != nil || st.Start != other.Start || st.State != 'T' {
		t.Errorf("the unrelated process %v was touched: state %c, err %v", other, st.State, err)
	}
	for _, name := range []string{proto.PauseFile, proto.PausedFile} {
		if exists(filepath.Join(l.Dir, name)) {
			t.Errorf("continue left %s", name)
		}
	}
}

// TestContinueCountsKilledAsSkipped proves that a process the pause held and
// that was killed while paused is counted skipped, not continued, even while
// it is a zombie its stopped parent cannot reap yet: a continue that finds
// only dead processes must say so, so the driver can relaunch.
func TestContinueCountsKilledAsSkipped(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg"))
	procs := map[string]proc{"harness": l.role("harness"), "bg": l.role("bg")}
	l.pause()
	wantHeld(t, procs)
	bg := procs["bg"]
	if err := unix.Kill(bg.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the killed process to be a zombie of its stopped parent", func() (bool, string) {
		st, err := readStat(bg.PID)
		return err == nil && st.State == 'Z', fmt.Sprintf("state %c, err %v", st.State, err)
	})
	res := l.resume()
	if res.Continued != 1 || res.Skipped != 1 {
		t.Errorf("continue after one of two held processes was killed: continued %d, skipped %d, want 1 and 1: %+v", res.Continued, res.Skipped, res)
	}
	waitRunning(t, map[string]proc{"harness": procs["harness"]})
}

// TestContinueAgainFindsLaunchRunning proves what a continue sent again
// (its first reply lost on the way) says: it continues nothing, but finds
// the launch's processes running, so the driver does not take the launch
// for gone.
func TestContinueAgainFindsLaunchRunning(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid"))
	procs := map[string]proc{"harness": l.role("harness"), "bg": l.role("bg"), "setsid": l.role("setsid")}
	l.pause()
	wantHeld(t, procs)
	if res := l.resume(); res.Continued != len(procs) || res.Found != len(procs) {
		t.Errorf("first continue: continued %d, found %d, want %d and %d: %+v", res.Continued, res.Found, len(procs), len(procs), res)
	}
	waitRunning(t, procs)
	if res := l.resume(); res.Continued != 0 || res.Found != len(procs) {
		t.Errorf("continue sent again: continued %d, found %d, want 0 and %d: %+v", res.Continued, res.Found, len(procs), res)
	}
}

// TestContinueReleasesAVforkParentHeldInD proves that continue clears the
// SIGSTOP of a process the pause held in an uninterruptible call: a vfork
// parent outside the harness's process group (so the group's SIGCONT does not
// reach it) waits in D with SIGSTOP pending, which pause counts as held. It
// still reads D at the continue; unless the continue sends it SIGCONT, it
// takes that stop the moment its child is gone and stays stopped for good
// (seen in CI under load, with a freshly exec'd sleep in D).
func TestContinueReleasesAVforkParentHeldInD(t *testing.T) {
	t.Parallel()
	bin := vforkCBinary(t)
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		// setsid(1) in a job of a shell without job control calls setsid()
		// and execs: the vfork parent is the shell's child, in a session and
		// process group of its own.
		l.detach(runFlags, plain("/bin/sh", "-c", `setsid "$0" & wait`, bin))
		h := l.harness()
		var parent, child proc
		testkit.Eventually(t, "the vfork parent to wait in D for its child", func() (bool, string) {
			kids := taskChildren(h.PID, h.PID)
			if len(kids) != 1 {
				return false, fmt.Sprintf("the shell has children %v", kids)
			}
			ps, err := readStat(kids[0])
			if err != nil {
				return false, err.Error()
			}
			ts, _ := readTaskStat(kids[0], kids[0])
			grand := taskChildren(kids[0], kids[0])
			if ts.State != 'D' || len(grand) != 1 {
				return false, fmt.Sprintf("parent %d in %c with children %v", kids[0], ts.State, grand)
			}
			cs, err := readStat(grand[0])
			if err != nil {
				return false, err.Error()
			}
			parent, child = proc{kids[0], ps.Start}, proc{grand[0], cs.Start}
			return true, ""
		})
		l.own(parent)
		l.own(child)
		if ps, _ := readStat(parent.PID); ps.PGID != parent.PID {
			t.Fatalf("fixture: the vfork parent %v leads no process group of its own (group %d)", parent, ps.PGID)
		}
		l.pause("--budget", "10s", "--d-budget", "20s")
		if !sigstopPending(parent.PID, parent.PID) {
			ps, _ := readStat(parent.PID)
			t.Fatalf("fixture: the paused vfork parent has no SIGSTOP pending (state %c)", ps.State)
		}
		l.resume()
		if sigstopPending(parent.PID, parent.PID) {
			t.Errorf("after continue the vfork parent still has SIGSTOP pending: it stops as soon as its call returns")
		}
		// Its child gone, the parent's clone returns and it exits (the
		// shell reaps it); a parent that kept the SIGSTOP stops instead.
		if st, err := readStat(child.PID); err == nil && st.Start == child.Start {
			unix.Kill(child.PID, unix.SIGKILL)
		}
		testkit.Eventually(t, "the vfork parent to run to its end once its child is gone", func() (bool, string) {
			st, err := readStat(parent.PID)
			if err != nil || st.Start != parent.Start || st.State == 'Z' {
				return true, ""
			}
			return false, fmt.Sprintf("vfork parent %v in state %c", parent, st.State)
		})
	})
}
