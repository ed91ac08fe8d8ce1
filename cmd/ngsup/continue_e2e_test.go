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
