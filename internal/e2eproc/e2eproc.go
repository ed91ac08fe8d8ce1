// Package e2eproc is what the end-to-end test packages (test/e2e,
// test/gym_e2e) share about processes: the servers they start as child
// processes (ngdriver serve, owner serve), each in a process group of its
// own with its output kept in the test's log folder, and the cleanup that
// ends exactly the processes a test started. A server is ended by pid with
// its tree frozen first (so no pid is reused under us) and by its process
// group; what a crashed server left running is ended by pid and start
// time; every launch of the test's sandboxes through `ngsup stop`. Nothing
// is ever killed by name.
package e2eproc

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/driver/fake"
)

// Proc is a server process of a test, in a process group of its own.
type Proc struct {
	// Name names it in logs and in its output files.
	Name string
	// Cmd is the running command.
	Cmd *exec.Cmd
	// Out and Errs collect its stdout and stderr.
	Out, Errs *Log
	// State is its exit state, set once it was reaped (Exited).
	State *os.ProcessState
	// Start is its start time (clock ticks since boot), read right after
	// it started: processes of the test's sandboxes are younger than the
	// test's first process.
	Start uint64
	done  chan struct{} // closed once the process was reaped
}

// Log is a buffer safe for one writer and many readers, which also copies
// what it gets to a file (kept for a failed test's log).
type Log struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	file *os.File
}

// Write appends p to the buffer and the file.
func (b *Log) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.file != nil {
		b.file.Write(p)
	}
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Log) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// StartProc starts bin with args in a process group of its own, with env
// added to the test's environment and its output in logDir/name.stdout and
// .stderr. The process gets SIGKILL if the test process dies first.
func StartProc(t *testing.T, bin, name, logDir string, env []string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, done: make(chan struct{})}
	outF, err := os.Create(filepath.Join(logDir, name+".stdout"))
	if err != nil {
		t.Fatal(err)
	}
	errF, err := os.Create(filepath.Join(logDir, name+".stderr"))
	if err != nil {
		t.Fatal(err)
	}
	p.Out, p.Errs = &Log{file: outF}, &Log{file: errF}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = p.Out, p.Errs
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.Cmd.WaitDelay = 5 * time.Second
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p.Start, _ = proctest.StartTicks(p.Cmd.Process.Pid)
	go func() {
		p.Cmd.Wait()
		p.State = p.Cmd.ProcessState
		outF.Close()
		errF.Close()
		close(p.done)
	}()
	return p
}

// PID is the process's pid.
func (p *Proc) PID() int { return p.Cmd.Process.Pid }

// Exited reports whether the process has ended (and was reaped).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitExit waits up to limit for the process to end and returns its exit
// code (-1 for a signal); ok is false when it did not end in time.
func (p *Proc) WaitExit(limit time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
		return p.State.ExitCode(), true
	case <-time.After(limit):
		return 0, false
	}
}

var listenLine = regexp.MustCompile(`listening on (http://[0-9.:\[\]]+)`)

// URL waits for the "listening on http://..." line the server prints and
// returns the address; the test fails if none comes.
func (p *Proc) URL(t *testing.T) string {
	t.Helper()
	var url string
	testkit.Eventually(t, p.Name+"'s listening line", func() (bool, string) {
		if m := listenLine.FindStringSubmatch(p.Out.String()); m != nil {
			url = m[1]
			return true, ""
		}
		if p.Exited() {
			t.Fatalf("%s exited (%v) before listening; stderr:\n%s", p.Name, p.State, Tail(p.Errs.String(), 3000))
		}
		return false, "none printed; stderr:\n" + Tail(p.Errs.String(), 3000)
	})
	return url
}

// KillTree ends the process and every descendant it has now: each is
// stopped (SIGSTOP) as it is found, so none forks again or exits and frees
// its pid, then all get SIGKILL, and so does the process group. It waits
// for the process to be reaped.
func (p *Proc) KillTree() {
	if !p.Exited() {
		for _, pid := range freezeTree(p.PID()) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		syscall.Kill(-p.PID(), syscall.SIGKILL)
	}
	<-p.done
}

// freezeTree stops root and its descendants, top down, and returns them.
func freezeTree(root int) []int {
	order := []int{root}
	seen := map[int]bool{root: true}
	for i := 0; i < len(order); i++ {
		pid := order[i]
		syscall.Kill(pid, syscall.SIGSTOP)
		waitStopped(pid)
		for _, c := range proctest.Children(pid) {
			if !seen[c] {
				seen[c] = true
				order = append(order, c)
			}
		}
	}
	return order
}

// waitStopped waits briefly until pid is stopped (or gone), so it forks
// nothing more once its children are listed.
func waitStopped(pid int) {
	for range 50 {
		switch proctest.State(pid) {
		case 0, 'T', 't', 'Z', 'X':
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Info describes a live process found by a scan.
type Info struct {
	PID   int
	Start uint64 // clock ticks since boot
	State string // one letter
	// Tag is its NEMO_GYM_HARNESS_LAUNCH (the launch it belongs to).
	Tag     string
	Cmdline string
}

// String describes the process for a test's message.
func (p Info) String() string {
	return fmt.Sprintf("pid %d state %s tag %q cmd %q", p.PID, p.State, p.Tag, p.Cmdline)
}

// ReadProc reads one process; ok is false when it is gone.
func ReadProc(pid int) (Info, bool) {
	st, ok := proctest.ReadStat(pid)
	if !ok {
		return Info{PID: pid}, false
	}
	return Info{PID: pid, Start: st.StartTicks, State: string(st.State), Tag: proctest.Tag(pid), Cmdline: proctest.Cmdline(pid)}, true
}

// Alive reports whether p still runs as the same process (same start
// time, not a zombie).
func (p Info) Alive() bool { return proctest.Same(p.PID, p.Start) }

// OwnProcesses lists the live processes of launches whose ids start with
// prefix: tagged with such a launch id, or naming the prefix on their
// command line (the supervisors, the harness scripts). Zombies are left
// out: they are already dead.
func OwnProcesses(prefix string) []Info {
	var out []Info
	self := os.Getpid()
	for _, pid := range proctest.Pids() {
		if pid == self {
			continue
		}
		info, ok := ReadProc(pid)
		if !ok || info.State == "Z" || info.State == "X" {
			continue
		}
		if strings.HasPrefix(info.Tag, prefix) || strings.Contains(info.Cmdline, "/"+prefix) || strings.Contains(info.Cmdline, " "+prefix) {
			out = append(out, info)
		}
	}
	return out
}

// SessionSteps lists the steps of rollout's fake sessions in the
// sandboxes under base (fake.ReadSteps), from whichever sandbox has one;
// with several (a fork and its origin), the longest.
func SessionSteps(base, rollout string) []string {
	dirs, _ := filepath.Glob(filepath.Join(base, "sandboxes", "*", ".ngharness", "state", "fake", rollout+"-a*"))
	var best []string
	for _, d := range dirs {
		if lines, err := fake.ReadSteps(d); err == nil && len(lines) > len(best) {
			best = lines
		}
	}
	return best
}

// RecordedLeftovers lists the processes the fake harness recorded in the
// pids files of its sessions in the sandboxes under base (harness, child,
// own_session, daemon, untagged: the untagged one carries no tag) that
// still run: same pid, younger than since (the test's first process), and
// the command line the harness gave it.
func RecordedLeftovers(base string, since uint64) []Info {
	sessions, _ := filepath.Glob(filepath.Join(base, "sandboxes", "*", ".ngharness", "state", "fake", "*"))
	seen := map[int]bool{}
	var out []Info
	for _, s := range sessions {
		recorded, _ := fake.ReadPids(s)
		for _, r := range recorded {
			kind, pid := r.Kind, r.PID
			if seen[pid] {
				continue
			}
			seen[pid] = true
			info, ok := ReadProc(pid)
			if !ok || info.State == "Z" || info.Start < since {
				continue
			}
			var match bool
			switch kind {
			case "harness":
				match = strings.Contains(info.Cmdline, "fake-harness.sh")
			case "daemon":
				match = strings.Contains(info.Cmdline, `echo "daemon`)
			default:
				match = info.Cmdline == "sleep 100000"
			}
			if match {
				out = append(out, info)
			}
		}
	}
	return out
}

// StopLaunches runs `ngsup stop --grace 0s` (ngsup is the binary's path)
// on every launch folder of the sandboxes under base (host paths), and
// reports the ones that failed as test errors.
func StopLaunches(t *testing.T, ngsup, base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, "sandboxes", "*", ".ngharness", "launches", "*"))
	slices.Sort(dirs)
	for _, d := range dirs {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		out, err := exec.CommandContext(ctx, ngsup, "stop", "--grace", "0s", "--dir", d).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("cleanup: ngsup stop --dir %s: %v: %s", d, err, bytes.TrimSpace(out))
		}
	}
}

// KillLeftovers kills the processes that are still the ones found (same
// start time), each held by a pidfd first.
func KillLeftovers(ps []Info) {
	for _, p := range ps {
		proctest.KillSame(p.PID, p.Start)
	}
}

// Orphans remembers the descendants of a server killed alone (a crash), by
// pid and start time, to end those still running at cleanup. The zero
// value is ready to use.
type Orphans struct {
	mu   sync.Mutex
	list []Info
}

// Add remembers every descendant root has now. Call it before killing
// root.
func (o *Orphans) Add(root int) {
	var found []Info
	for _, pid := range proctest.Descendants(root) {
		if info, ok := ReadProc(pid); ok {
			found = append(found, info)
		}
	}
	o.mu.Lock()
	o.list = append(o.list, found...)
	o.mu.Unlock()
}

// Kill ends the remembered processes still running with the same start
// time.
func (o *Orphans) Kill() {
	o.mu.Lock()
	defer o.mu.Unlock()
	KillLeftovers(o.list)
}

// Tail is the last n bytes of s, marked as cut when it was.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// ErrorsIn returns the lines of a server's stderr that report a data race
// or a panic.
func ErrorsIn(stderr string) []string {
	var out []string
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "DATA RACE") || strings.HasPrefix(line, "panic:") || strings.HasPrefix(line, "fatal error:") {
			out = append(out, line)
		}
	}
	return out
}
