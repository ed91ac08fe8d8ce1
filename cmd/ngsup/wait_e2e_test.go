package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestWaitSleepsUntilTheLaunchMovesOn proves that `ngsup wait` on a running
// launch costs nothing while it runs: no timer wakes it (it counts the
// context switches of every thread of the wait over 2 s of the run: a wait
// that looked at the supervisor every second, as it did, woke dozens of
// times, the Go runtime with it). It still learns every way the launch
// moves on: with its supervisor SIGKILLed it goes on waiting while the
// harness lives, and once the harness is killed too it returns at once,
// reporting the end the supervisor could not record.
func TestWaitSleepsUntilTheLaunchMovesOn(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness"))
	h := l.harness()

	cmd := exec.Command(ngsupBin, "wait", "--dir", l.Dir)
	cmd.Env = baseEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		// Through the pidfd os/exec holds: once the wait was reaped its pid
		// (and a group of that number) may be another test's.
		cmd.Process.Kill()
		err := <-done
		done <- err
	})
	wpid := cmd.Process.Pid
	testkit.Eventually(t, "the wait to block in poll", func() (bool, string) {
		var seen []string
		for _, tid := range tids(wpid) {
			w := wchanOf(wpid) // the process's; a thread's below
			if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/wchan", wpid, tid)); err == nil {
				w = strings.TrimSpace(string(data))
			}
			if strings.Contains(w, "poll") {
				return true, ""
			}
			seen = append(seen, w)
		}
		return false, fmt.Sprintf("threads in %v", seen)
	})
	awaitQuiet(t, "the wait", wpid, func() {
		select {
		case err := <-done:
			t.Fatalf("the wait returned while the launch runs: %v\n%s%s", err, stdout.String(), stderr.String())
		default:
		}
	})
	if woke := wokeIn(t, wpid, 2*time.Second); woke > 2 {
		t.Errorf("the wait %d woke up %d times in 2 s of a running launch, want none", wpid, woke)
	}

	killSupervisor(t, l)
	select {
	case err := <-done:
		t.Fatalf("the wait returned while the harness runs: %v\n%s%s", err, stdout.String(), stderr.String())
	case <-time.After(300 * time.Millisecond):
	}
	if !signalProc(h, unix.SIGKILL) {
		t.Fatalf("could not kill the harness %v", h)
	}
	var err error
	testkit.Eventually(t, "the wait to return", func() (bool, string) {
		select {
		case err = <-done:
			done <- err
			return true, ""
		default:
			return false, "still waiting"
		}
	})
	if err != nil {
		t.Fatalf("the wait failed: %v\n%s", err, stderr.String())
	}
	var rc proto.Receipt
	if err := json.Unmarshal(stdout.Bytes(), &rc); err != nil {
		t.Fatalf("the wait printed %q: %v", stdout.String(), err)
	}
	if !rc.Ended || rc.ExitCode != -1 || rc.Error == "" {
		t.Errorf("the wait reported %+v, want the end the supervisor could not record (exit -1, an error)", rc)
	}
}
