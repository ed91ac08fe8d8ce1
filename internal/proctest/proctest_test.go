package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// start runs argv (in a process group of its own, with env added) and
// kills the group when the test ends.
func start(t *testing.T, env []string, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}

// TestReadsARealProcess reads a shell with a child, whose command name
// holds a space and parentheses (the name ends at the last ')'): its stat,
// its child, its environment and its command line.
func TestReadsARealProcess(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	odd := filepath.Join(t.TempDir(), "a) (b")
	if err := os.Symlink(sh, odd); err != nil {
		t.Fatal(err)
	}
	cmd := start(t, []string{proto.TagEnv + "=launch-1", "PT_KEY=v=1"}, odd, "-c", "sleep 300 & wait", "x")
	pid := cmd.Process.Pid
	var kids []int
	testkit.Eventually(t, "the shell's sleep", func() (bool, string) {
		kids = Children(pid)
		return len(kids) == 1, fmt.Sprintf("children %v", kids)
	})
	st, ok := ReadStat(pid)
	if !ok || st.PID != pid || st.PPID != os.Getpid() || !st.Live() || st.StartTicks == 0 {
		t.Fatalf("stat %+v %v", st, ok)
	}
	if st.Comm != "a) (b" {
		t.Errorf("comm %q, want %q", st.Comm, "a) (b")
	}
	if start, ok := StartTicks(pid); !ok || start != st.StartTicks || !Same(pid, start) || Same(pid, start+1) {
		t.Errorf("start ticks %d %v, stat says %d", start, ok, st.StartTicks)
	}
	if d := Descendants(pid); !slices.Equal(d, kids) {
		t.Errorf("descendants %v, children %v", d, kids)
	}
	if Tag(pid) != "launch-1" || Tag(kids[0]) != "launch-1" {
		t.Errorf("tags %q %q", Tag(pid), Tag(kids[0]))
	}
	if v, ok := Env(pid, "PT_KEY"); !ok || v != "v=1" {
		t.Errorf("PT_KEY %q %v", v, ok)
	}
	if _, ok := Env(pid, "PT_UNSET"); ok {
		t.Error("an unset variable reads as set")
	}
	if c := Cmdline(pid); c != odd+" -c sleep 300 & wait x" {
		t.Errorf("cmdline %q", c)
	}
	if d := Describe(pid); !strings.HasPrefix(d, fmt.Sprintf("%d ", pid)) || !strings.HasSuffix(d, fmt.Sprintf(" (a) (b) %q", Cmdline(pid))) {
		t.Errorf("describe %q", d)
	}
	if !slices.Contains(Pids(), pid) {
		t.Errorf("pid %d not among Pids", pid)
	}
}

// TestKillSignalsOnlyTheSameProcess: a wrong start time (another process
// under the pid) is never signalled; the right one is, and then reads as
// gone (a zombie until reaped, so not Same).
func TestKillSignalsOnlyTheSameProcess(t *testing.T) {
	cmd := start(t, nil, "sleep", "300")
	pid := cmd.Process.Pid
	st, _ := ReadStat(pid)
	if KillSame(pid, st.StartTicks+1) {
		t.Fatal("killed a process of another start time")
	}
	if !Same(pid, st.StartTicks) {
		t.Fatal("the process died of a kill that was not sent")
	}
	if !KillSame(pid, st.StartTicks) {
		t.Fatal("did not kill the process it was given")
	}
	testkit.Eventually(t, "the killed sleep gone", func() (bool, string) {
		return !Same(pid, st.StartTicks), fmt.Sprintf("state %q", State(pid))
	})
	cmd.Wait()
	if State(pid) != 0 {
		t.Errorf("a reaped process has state %q", State(pid))
	}
}

// TestHeldOnlyWhenStopped: a running sleep is not held, the same sleep
// stopped is, and neither another start time nor a killed one is.
func TestHeldOnlyWhenStopped(t *testing.T) {
	cmd := start(t, nil, "sleep", "300")
	pid := cmd.Process.Pid
	st, _ := ReadStat(pid)
	if held, why := Held(pid, st.StartTicks); held || !strings.Contains(why, "without SIGSTOP pending") {
		t.Errorf("a running sleep: held %v (%s)", held, why)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the stopped sleep held", func() (bool, string) {
		return Held(pid, st.StartTicks)
	})
	if held, why := Held(pid, st.StartTicks+1); held || why != "gone" {
		t.Errorf("another start time: held %v (%s)", held, why)
	}
	KillSame(pid, st.StartTicks)
	testkit.Eventually(t, "the killed sleep not held", func() (bool, string) {
		held, why := Held(pid, st.StartTicks)
		return !held, why
	})
}
