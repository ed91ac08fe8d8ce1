package cliexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
)

// TestParseMarkers proves the markers are read wherever the command's own
// output puts them: client noise before the start is the client's, a fake
// end marker with another nonce is the command's output, and a missing end
// means the command never reported its end.
func TestParseMarkers(t *testing.T) {
	n := "0123456789abcdef"
	start, end := "\x1engx-"+n+"-start\n", "\n\x1engx-"+n+"-end 3\n"
	o := Parse([]byte("Defaulted container\n"+start+"err\x1engx-0000-end 0\nmore\n"+end+"command terminated with exit code 3\n"), n)
	if !o.Started || !o.Ended || o.ExitCode != 3 {
		t.Fatalf("outcome %+v", o)
	}
	if string(o.Stderr) != "err\x1engx-0000-end 0\nmore\n" {
		t.Errorf("stderr %q", o.Stderr)
	}
	if string(o.Client) != "Defaulted container\ncommand terminated with exit code 3\n" {
		t.Errorf("client %q", o.Client)
	}
	if o := Parse([]byte("Error: No such container: x\n"), n); o.Started || o.Ended || string(o.Client) != "Error: No such container: x\n" {
		t.Errorf("a client failure: %+v", o)
	}
	if o := Parse([]byte(start+"partial"), n); !o.Started || o.Ended || string(o.Stderr) != "partial" {
		t.Errorf("a broken connection: %+v", o)
	}
}

// TestScriptRunsUnderDashAndBash proves the script's exit codes, stdin and
// stderr under both shells a sandbox is likely to have, and that the
// command itself does not carry the tag.
func TestScriptRunsUnderDashAndBash(t *testing.T) {
	for _, shell := range []string{"/bin/sh", "/bin/bash"} {
		if _, err := exec.LookPath(shell); err != nil {
			continue
		}
		n := Nonce()
		cmd := exec.Command(shell, "-c", Script(`read x; echo "got $x"; echo "tag=${`+TagEnv+`-none}"; echo oops >&2; kill -TERM $$`, 5*time.Second, n, Fence(t.TempDir(), n)))
		cmd.Stdin = strings.NewReader("line\n")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run()
		o := Parse([]byte(stderr.String()), n)
		if !o.Ended || o.ExitCode != 143 || stdout.String() != "got line\ntag=none\n" || string(o.Stderr) != "oops\n" || len(o.Client) != 0 {
			t.Errorf("%s: outcome %+v stdout %q raw stderr %q", shell, o, stdout.String(), stderr.String())
		}
	}
}

// startScript runs Script(line) under /bin/sh on this machine, in a process
// group of its own that the test kills when it ends.
func startScript(t *testing.T, line, nonce, fence string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", Script(line, time.Minute, nonce, fence))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd, &stderr
}

func runKill(t *testing.T, nonce, fence string) {
	t.Helper()
	if out, err := exec.Command("/bin/sh", "-c", KillScript(nonce, fence)).CombinedOutput(); err != nil {
		t.Fatalf("the kill script: %v: %s", err, out)
	}
}

// waitGone waits (up to 10 s) until pid no longer runs (a zombie counts as
// gone) and fails the test if it still does.
func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st, ok := proctest.ReadStat(pid); !ok || !st.Live() {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	t.Errorf("%s (pid %d) still runs after the kill script", what, pid)
}

func readPID(t *testing.T, file string) int {
	t.Helper()
	var pid int
	testkit.Eventually(t, "the command writes "+file, func() (bool, string) {
		b, _ := os.ReadFile(file)
		var err error
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && strings.HasSuffix(string(b), "\n"), fmt.Sprintf("%q", b)
	})
	return pid
}

// TestKillScriptEndsTheCommand proves that the kill script ends a running
// command found by its tag alone (no pid needed), with what it started in
// its group, and leaves what left the group (setsid) alone; and that a
// script the kill script ran before never runs its command (the fence),
// and removes the fence.
func TestKillScriptEndsTheCommand(t *testing.T) {
	if _, err := exec.LookPath("timeout"); err != nil {
		t.Skip("no timeout(1) on this machine")
	}
	dir := t.TempDir()
	n := Nonce()
	line := fmt.Sprintf("sleep 300 & echo $! > %[1]s/child; setsid sleep 301 </dev/null >/dev/null 2>&1 & echo $! > %[1]s/left; echo $$ > %[1]s/pid; exec sleep 302", dir)
	cmd, stderr := startScript(t, line, n, Fence(dir, n))
	pid, child, left := readPID(t, dir+"/pid"), readPID(t, dir+"/child"), readPID(t, dir+"/left")
	t.Cleanup(func() { _ = syscall.Kill(left, syscall.SIGKILL) })
	runKill(t, n, Fence(dir, n))
	if err := cmd.Wait(); err == nil {
		t.Errorf("the script exited 0 after the kill")
	}
	waitGone(t, pid, "the command")
	waitGone(t, child, "the command's child")
	if err := syscall.Kill(left, 0); err != nil {
		t.Errorf("the process that left the command's group was killed too: %v", err)
	}
	if o := Parse([]byte(stderr.String()), n); !o.Started {
		t.Errorf("no start marker: %q", stderr.String())
	}
	if _, err := os.Stat(Fence(dir, n)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fence of a command that was found is left: %v", err)
	}

	// Killed before it began: it runs nothing, and takes the fence away.
	n = Nonce()
	runKill(t, n, Fence(dir, n))
	if _, err := os.Stat(Fence(dir, n)); err != nil {
		t.Fatalf("the kill script of a command not begun left no fence: %v", err)
	}
	cmd, stderr = startScript(t, "touch "+dir+"/ran", n, Fence(dir, n))
	if err := cmd.Wait(); err == nil {
		t.Errorf("a fenced script exited 0")
	}
	if _, err := os.Stat(dir + "/ran"); err == nil {
		t.Errorf("a script the kill script came before ran its command")
	}
	if o := Parse([]byte(stderr.String()), n); o.Started {
		t.Errorf("a fenced script printed its start marker")
	}
	if _, err := os.Stat(Fence(dir, n)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fenced script left its fence: %v", err)
	}
}

// TestRunCancelledReportsTheContext proves that a client killed because its
// context ended is reported as the context's end every time, never as a
// client that exited on its own (which Target.run would take for a broken
// connection, and then not end the command in the sandbox). The kill and
// the client's exit race, so it is tried many times.
func TestRunCancelledReportsTheContext(t *testing.T) {
	t.Parallel()
	c := &Client{Path: "/bin/sh", Args: []string{"-c"}}
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		var res Result
		var err error
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			r, w, perr := os.Pipe()
			if perr != nil {
				err = perr
				close(started)
				return
			}
			go func() {
				buf := make([]byte, 1)
				_, _ = r.Read(buf)
				r.Close()
				close(started)
			}()
			res, err = c.Run(ctx, Call{Args: []string{"echo x; exec sleep 30"}, Stdout: w})
			w.Close()
		}()
		<-started
		cancel()
		<-finished
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("try %d: a cancelled client returned %v (exit %d), want context.Canceled", i, err, res.ExitCode)
		}
	}
}
