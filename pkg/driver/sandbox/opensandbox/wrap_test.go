package opensandbox

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/driver/sandbox"
)

// TestScriptWaitsForAStoppedJobToItsEnd runs the exec script in bash on
// this machine, many at once (the window it closes is widest when the
// machine is busy), for a job that stops itself: one that is continued by
// its own child and exits 5 is reported exit 5 with its output, not as
// stopped (147); one stopped for good is reported timed out once the
// watcher killed it, with the status of that kill (137), not 147; a
// command that exits 147 of itself keeps that status. With a plain `wait`
// after `set +m`, a job that stopped before job control went off was
// reported 147 at once (5 runs of 30 at a load of 250) and left stopped
// behind the script.
func TestScriptWaitsForAStoppedJobToItsEnd(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	cases := []struct {
		name, line string
		timeout    time.Duration
		want       report
		stdout     string
	}{
		{"continued", `echo $$ >%[1]s; (sleep 0.3; kill -CONT $$) & kill -STOP $$; echo resumed; exit 5`, time.Minute, report{ended: true, exitCode: 5}, "resumed\n"},
		{"stopped for good", `echo $$ >%[1]s; kill -STOP $$; echo resumed`, time.Second, report{ended: true, exitCode: 137, timedOut: true}, ""},
		{"exits 147", `exit 147`, time.Minute, report{ended: true, exitCode: 147}, ""},
	}
	const runs = 12
	var wg sync.WaitGroup
	var mu sync.Mutex
	var fails []string
	for _, c := range cases {
		for i := range runs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tmp := t.TempDir()
				nonce := fmt.Sprintf("%x", 0xabc000+i)
				jobFile := filepath.Join(tmp, "job")
				line := c.line
				if strings.Contains(line, "%[1]s") {
					line = fmt.Sprintf(line, sandbox.Quote(jobFile))
				}
				defer endJob(jobFile)
				cmd := exec.Command("bash", "-c", Script(line, c.timeout, tmp, nonce, "", 1<<20))
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				var out bytes.Buffer
				cmd.Stdout = &out
				err := cmd.Start()
				if err == nil {
					// Whatever happens, nothing of this run stays behind: the
					// script's group, and the job's, which it names in .pid.
					done := make(chan struct{})
					go func() {
						select {
						case <-done:
						case <-time.After(30 * time.Second):
							syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
						}
					}()
					err = cmd.Wait()
					close(done)
				}
				rep, perr := parseReport(out.Bytes(), nonce)
				got := fmt.Sprintf("ended %v exit %d timed out %v stdout %q", rep.ended, rep.exitCode, rep.timedOut, rep.stdout)
				want := fmt.Sprintf("ended %v exit %d timed out %v stdout %q", c.want.ended, c.want.exitCode, c.want.timedOut, c.stdout)
				if err != nil || perr != nil || got != want {
					mu.Lock()
					fails = append(fails, fmt.Sprintf("%s run %d: %s (script %v, report %v), want %s", c.name, i, got, err, perr, want))
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for _, f := range fails {
		t.Error(f)
	}
}

// endJob kills the job whose pid the test's command wrote to jobFile, if it
// is still that command (its command line names jobFile): a script that
// reported too early left it stopped.
func endJob(jobFile string) {
	data, err := os.ReadFile(jobFile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return
	}
	fd, err := syscall.Open(fmt.Sprintf("/proc/%d", pid), syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return
	}
	defer syscall.Close(fd)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err == nil && bytes.Contains(cmdline, []byte(jobFile)) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
