package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestPauseEscapedProcesses proves that pause stops, and continue resumes,
// the processes that escape the harness's process group: a double-forked
// daemon in a session of its own, a child in its own session (as every
// OpenCode tool call is), and a child that cleared its environment, besides
// the harness and a child in its group.
func TestPauseEscapedProcesses(t *testing.T) {
	t.Parallel()
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		l.detach(runFlags, helper("harness", "-daemon", "-setsid", "-noenv", "-bg"))
		procs := map[string]proc{}
		for _, role := range []string{"harness", "daemon", "setsid", "noenv", "bg"} {
			procs[role] = l.role(role)
		}
		h := procs["harness"]
		for _, role := range []string{"daemon", "setsid"} {
			if st, _ := readStat(procs[role].PID); st.SID == h.PID || st.PGID == h.PID {
				t.Fatalf("fixture: %s should be in a session of its own: %+v", role, st)
			}
		}
		res := l.pause()
		wantMethod(t, l, res, method)
		wantHeld(t, procs)
		if res.Processes < len(procs) {
			t.Errorf("pause holds %d processes, want at least %d", res.Processes, len(procs))
		}
		l.resume()
		waitRunning(t, procs)
	})
}

// TestPauseAfterSupervisorKilled proves that pause and continue still reach
// every process of a launch whose supervisor was killed (and is left a
// zombie until its parent reaps it): the harness, the daemon in another
// session (found by its tag) and the child that cleared its environment
// (a descendant of the harness).
func TestPauseAfterSupervisorKilled(t *testing.T) {
	t.Parallel()
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		l.detach(runFlags, helper("harness", "-daemon", "-setsid", "-noenv", "-bg"))
		procs := map[string]proc{}
		for _, role := range []string{"harness", "daemon", "setsid", "noenv", "bg"} {
			procs[role] = l.role(role)
		}
		daemon := procs["daemon"]
		testkit.Eventually(t, "the daemon to be adopted by the supervisor", func() (bool, string) {
			st, _ := readStat(daemon.PID)
			return st.PPID == l.Sup.PID, "ppid " + itoa(st.PPID)
		})
		sup := proc{l.Sup.PID, l.Sup.StartTicks}
		if err := unix.Kill(sup.PID, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, "the supervisor to die", func() (bool, string) { return !alive(sup), "alive" })
		res := l.pause()
		if res.Supervised || res.Method != proto.MethodScan {
			t.Errorf("pause: supervised %v method %q, want false %q", res.Supervised, res.Method, proto.MethodScan)
		}
		wantHeld(t, procs)
		l.resume()
		waitRunning(t, procs)
	})
}

// TestPauseChildrenOfNonMainThreads proves that pause stops children forked
// by threads other than the main one (each listed only in its own thread's
// /proc/PID/task/TID/children), all of them, even when they are in sessions
// of their own.
func TestPauseChildrenOfNonMainThreads(t *testing.T) {
	t.Parallel()
	const n, k = 4, 3
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		l.detach(runFlags, helper("threads", "-n", strconv.Itoa(n), "-k", strconv.Itoa(k)))
		procs := map[string]proc{"harness": l.role("harness")}
		for i := 0; i < n; i++ {
			for j := 0; j < k; j++ {
				role := fmt.Sprintf("child-%d-%d", i, j)
				procs[role] = l.role(role)
			}
		}
		// The fixture must really fork from several threads.
		h := procs["harness"]
		forkers := 0
		listed := 0
		for _, tid := range tids(h.PID) {
			if kids := taskChildren(h.PID, tid); len(kids) > 0 {
				forkers++
				listed += len(kids)
				if tid == h.PID {
					t.Logf("the main thread forked %d of the children", len(kids))
				}
			}
		}
		if forkers < 2 || listed != n*k {
			t.Fatalf("fixture: %d children listed under %d threads, want %d under at least 2", listed, forkers, n*k)
		}
		res := l.pause()
		wantMethod(t, l, res, method)
		wantHeld(t, procs)
		if res.Processes < n*k+1 {
			t.Errorf("pause holds %d processes, want at least %d", res.Processes, n*k+1)
		}
		l.resume()
		waitRunning(t, procs)
	})
}

// TestPauseZombieLeaderWithLiveThreads proves that pause stops the live
// threads of a process whose thread-group leader exited (raw exit, not
// exit_group): /proc/PID/stat shows Z, yet every other thread must end up
// stopped (checked in /proc/PID/task/*/stat), and continue lets them run.
// The process is a child of the harness in a session of its own, so only the
// walk of the launch reaches it when there is no cgroup.
func TestPauseZombieLeaderWithLiveThreads(t *testing.T) {
	t.Parallel()
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		l.detach(runFlags, helper("harness", "-setsid-helper", "zombie-lead"))
		h := l.role("zombie-lead")
		testkit.Eventually(t, "the leader to be a zombie with live threads", func() (bool, string) {
			st, err := readStat(h.PID)
			if err != nil {
				return false, err.Error()
			}
			live := liveThreads(h.PID)
			return st.State == 'Z' && len(live) >= 3, fmt.Sprintf("leader %c, live threads %v", st.State, live)
		})
		res := l.pause()
		wantMethod(t, l, res, method)
		states := map[int]byte{}
		for _, tid := range tids(h.PID) {
			ts, err := readTaskStat(h.PID, tid)
			if err != nil {
				continue
			}
			states[tid] = ts.State
			switch {
			case tid == h.PID && ts.State != 'Z':
				t.Errorf("leader thread %d in state %c, want Z", tid, ts.State)
			case tid != h.PID && !isStoppedState(ts.State):
				t.Errorf("thread %d of the zombie leader %d runs (state %c) while paused", tid, h.PID, ts.State)
			}
		}
		t.Logf("threads while paused: %s", fmtStates(states))
		if res.Processes < 1 {
			t.Errorf("pause holds %d processes: the zombie leader with live threads must count", res.Processes)
		}
		l.resume()
		testkit.Eventually(t, "the threads to run again", func() (bool, string) {
			for _, tid := range tids(h.PID) {
				if ts, err := readTaskStat(h.PID, tid); err == nil && isStoppedState(ts.State) {
					return false, fmt.Sprintf("thread %d state %c", tid, ts.State)
				}
			}
			return len(liveThreads(h.PID)) >= 3, "threads gone"
		})
	})
}

// TestPauseVforkParent proves that pause confirms a vfork parent, whose
// thread waits in D until its child execs or exits (here: never, the child
// sleeps), instead of waiting for T forever: the child is stopped and the
// parent counts as held. Two parents: the Go fixture (its other threads take
// the group stop, the vforking thread stays in D) and a single-threaded C
// program, which sits in D with SIGSTOP pending (ShdPnd), the trap as the
// notes measured it.
func TestPauseVforkParent(t *testing.T) {
	t.Parallel()
	t.Run("go", func(t *testing.T) {
		t.Parallel()
		cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
			testVforkParent(t, runFlags, method, helper("vfork"), false)
		})
	})
	t.Run("c", func(t *testing.T) {
		t.Parallel()
		bin := vforkCBinary(t)
		cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
			testVforkParent(t, runFlags, method, plain(bin), true)
		})
	})
}

func testVforkParent(t *testing.T, runFlags []string, method string, cmd command, singleThreaded bool) {
	l := newLaunch(t)
	l.detach(runFlags, cmd)
	h := l.harness()
	var child proc
	testkit.Eventually(t, "the vfork parent to wait in D for its child", func() (bool, string) {
		ts, err := readTaskStat(h.PID, h.PID)
		if err != nil {
			return false, err.Error()
		}
		kids := taskChildren(h.PID, h.PID)
		if len(kids) != 1 || ts.State != 'D' {
			return false, fmt.Sprintf("main thread %c, children %v", ts.State, kids)
		}
		st, err := readStat(kids[0])
		if err != nil {
			return false, err.Error()
		}
		child = proc{kids[0], st.Start}
		return true, ""
	})
	l.own(child)
	if n := len(tids(h.PID)); singleThreaded && n != 1 {
		t.Fatalf("fixture: the C vfork parent has %d threads", n)
	}
	t.Logf("vfork parent %d waits in %s", h.PID, wchanOf(h.PID))
	res := l.pause("--budget", "10s", "--d-budget", "20s")
	wantMethod(t, l, res, method)
	wantHeld(t, map[string]proc{"vfork parent": h, "vfork child": child})
	if ts, _ := readTaskStat(h.PID, h.PID); ts.State != 'D' {
		t.Errorf("the vfork parent's thread left D (%c) while its child is paused", ts.State)
	}
	if cs, _ := readStat(child.PID); !isStoppedState(cs.State) {
		t.Errorf("the vfork child is in state %c, want T", cs.State)
	}
	if singleThreaded && !sigstopPending(h.PID, h.PID) {
		t.Errorf("the single-threaded vfork parent is held without SIGSTOP pending")
	}
	t.Logf("vfork parent: SIGSTOP pending %v; threads %s", sigstopPending(h.PID, h.PID), taskStates(h.PID))
	l.resume()
	waitRunning(t, map[string]proc{"vfork parent": h, "vfork child": child})
}

// vforkC is the single-threaded vfork parent: raw clone with
// CLONE_VFORK|SIGCHLD and no CLONE_VM; the child only sleeps 1000 s and
// exits.
const vforkC = `#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

int main(void) {
	long r = syscall(SYS_clone, CLONE_VFORK | SIGCHLD, 0, 0, 0, 0);
	if (r == 0) {
		struct timespec ts = {1000, 0};
		syscall(SYS_nanosleep, &ts, 0);
		syscall(SYS_exit_group, 0);
	}
	return 0;
}
`

var vforkCOnce struct {
	sync.Once
	bin, skip string
	err       error
}

// vforkCBinary compiles vforkC with gcc once, or skips the test when there
// is no gcc.
func vforkCBinary(t *testing.T) string {
	t.Helper()
	vforkCOnce.Do(func() {
		gcc, err := exec.LookPath("gcc")
		if err != nil {
			vforkCOnce.skip = "no gcc to build the single-threaded C vfork parent"
			return
		}
		dir := filepath.Dir(ngsupBin)
		src := filepath.Join(dir, "vfork.c")
		if err := os.WriteFile(src, []byte(vforkC), 0o644); err != nil {
			vforkCOnce.err = err
			return
		}
		bin := filepath.Join(dir, "vfork-parent")
		if out, err := exec.Command(gcc, "-O1", "-o", bin, src).CombinedOutput(); err != nil {
			vforkCOnce.err = fmt.Errorf("gcc: %v: %s", err, out)
			return
		}
		vforkCOnce.bin = bin
	})
	switch {
	case vforkCOnce.skip != "":
		t.Skip(vforkCOnce.skip)
	case vforkCOnce.err != nil:
		t.Fatal(vforkCOnce.err)
	}
	return vforkCOnce.bin
}

// TestPauseForkingTree proves that pause contains a tree that starts a new
// child every 2 ms, forever: afterwards every process is stopped and the set
// of processes stays the same over the next 300 ms. With the cgroup freezer
// and with signals only.
func TestPauseForkingTree(t *testing.T) {
	t.Parallel()
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		l.detach(runFlags, helper("storm", "-every", "2ms", "-life", "1"))
		h := l.role("harness")
		testkit.Eventually(t, "the tree to grow", func() (bool, string) {
			n := len(l.tagged())
			return n >= 20, fmt.Sprintf("%d processes", n)
		})
		res := l.pause()
		wantMethod(t, l, res, method)
		before := procSet(l.tagged())
		if !slices.Contains(before, h) {
			t.Fatalf("the harness %v is not among the launch's processes", h)
		}
		check := func(when string, procs []proc) {
			for _, p := range procs {
				if ok, why := held(p); !ok {
					t.Errorf("%s: not held: %s", when, why)
				}
			}
		}
		check("right after pause", before)
		time.Sleep(300 * time.Millisecond)
		after := procSet(l.tagged())
		check("300 ms after pause", after)
		if !slices.Equal(before, after) {
			t.Errorf("the paused tree changed over 300 ms: %d processes, then %d (new %v, gone %v)",
				len(before), len(after), minus(after, before), minus(before, after))
		}
		t.Logf("paused %d processes (pause says %d) in %.1f ms, %d passes", len(before), res.Processes, res.ElapsedMS, res.Passes)
		l.resume()
		testkit.Eventually(t, "the tree to fork again", func() (bool, string) {
			n := len(minus(procSet(l.tagged()), before))
			return n > 0, "no new process"
		})
	})
}

// fileState is what the files-unchanged test compares.
type fileState struct {
	data  string
	mtime time.Time
}

func statFile(t *testing.T, path string) fileState {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return fileState{string(data), fi.ModTime()}
}

// TestPauseFilesUnchanged proves that a paused launch writes nothing: a
// harness and its child (in a session of its own) write a counter to files
// every 10 ms; after pause their contents and mtimes are unchanged 300 ms
// later, and after continue they change again.
func TestPauseFilesUnchanged(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	file := filepath.Join(l.Rec, "count")
	l.detach(nil, helper("counter", "-file", file, "-child"))
	procs := map[string]proc{"harness": l.role("harness"), "counter-child": l.role("counter-child")}
	files := []string{file, file + ".child"}
	for _, f := range files {
		testkit.Eventually(t, f+" to count", func() (bool, string) {
			data, _ := os.ReadFile(f)
			n, _ := strconv.Atoi(strings.TrimSpace(string(data)))
			return n >= 3, fmt.Sprintf("%q", data)
		})
	}
	l.pause()
	wantHeld(t, procs)
	before := map[string]fileState{}
	for _, f := range files {
		before[f] = statFile(t, f)
	}
	time.Sleep(300 * time.Millisecond)
	for _, f := range files {
		if now := statFile(t, f); now != before[f] {
			t.Errorf("%s changed while paused: %+v -> %+v", filepath.Base(f), before[f], now)
		}
	}
	l.resume()
	for _, f := range files {
		testkit.Eventually(t, filepath.Base(f)+" to change after continue", func() (bool, string) {
			now := statFile(t, f)
			return now.data != before[f].data && !now.mtime.Equal(before[f].mtime), fmt.Sprintf("%+v", now)
		})
	}
}

// TestPausedTwiceLosesNoStep proves that a launch paused and continued twice
// finishes with nothing lost or repeated: the harness appends steps 1..N to a
// file; at the end the file holds exactly 1..N in order and the receipt's exit
// code is 0.
func TestPausedTwiceLosesNoStep(t *testing.T) {
	t.Parallel()
	const n = 100
	l := newLaunch(t)
	file := filepath.Join(l.Rec, "steps")
	l.detach(nil, helper("steps", "-file", file, "-n", strconv.Itoa(n), "-gap", "15ms"))
	h := l.role("harness")
	lines := func() int { return bytes.Count(readFile(file), []byte("\n")) }
	last := 0
	for round := 1; round <= 2; round++ {
		testkit.Eventually(t, "more steps", func() (bool, string) {
			c := lines()
			return c >= last+3, fmt.Sprintf("%d steps", c)
		})
		l.pause()
		wantHeld(t, map[string]proc{"harness": h})
		held := string(readFile(file))
		time.Sleep(200 * time.Millisecond)
		if now := string(readFile(file)); now != held {
			t.Errorf("round %d: steps written while paused: %q -> %q", round, held, now)
		}
		last = lines()
		l.resume()
	}
	if last >= n {
		t.Fatalf("the harness finished (%d steps) before the second pause; the test proves nothing", last)
	}
	rc := l.wait()
	if rc.ExitCode != 0 {
		t.Errorf("exit code %d, want 0 (%+v)", rc.ExitCode, rc)
	}
	var want strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if got := string(readFile(file)); got != want.String() {
		t.Errorf("steps file:\n%q\nwant 1..%d once each, in order", got, n)
	}
}

// TestPauseEndedLaunchKeepsResult proves that pausing a launch that already
// ended exits 3, leaves the receipt byte-for-byte as it was, and leaves no
// pause file behind.
func TestPauseEndedLaunchKeepsResult(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-exit", "3"))
	rc := l.wait()
	if rc.ExitCode != 3 {
		t.Fatalf("exit code %d, want 3", rc.ExitCode)
	}
	receipt := filepath.Join(l.Dir, proto.ReceiptFile)
	before := readFile(receipt)
	r := l.verb("pause")
	wantCode(t, r, 3)
	var res proto.PauseResult
	r.json(t, &res)
	if res.Paused || !res.Ended || res.Processes != 0 {
		t.Errorf("pause of an ended launch: %+v", res)
	}
	if after := readFile(receipt); !bytes.Equal(before, after) {
		t.Errorf("the receipt changed:\n%q\n%q", before, after)
	}
	for _, f := range []string{proto.PauseFile, proto.PausedFile} {
		if exists(filepath.Join(l.Dir, f)) {
			t.Errorf("pause of an ended launch left %s behind", f)
		}
	}
	if got := l.status(); got.ExitCode != 3 || !got.Ended {
		t.Errorf("status after the pause: %+v", got)
	}
}

// tracer holds one process under ptrace (PTRACE_SEIZE) from a goroutine
// locked to its OS thread, and suppresses every SIGSTOP it gets: on each
// signal-delivery-stop for SIGSTOP it resumes the tracee with signal 0
// (after tracerDelay, as a tracer that does some work would), so the tracee
// never stops for long. Other signals are passed on.
// tracerDelay is how long the tracer holds a tracee in its
// signal-delivery-stop before resuming it: long enough that a pause reads the
// t state, far shorter than the pause's settle time for ptrace stops.
const tracerDelay = 2 * time.Millisecond

type tracer struct {
	pid        int
	quit       atomic.Bool
	suppressed atomic.Int64
	done       chan error
}

func startTracer(t *testing.T, pid int) *tracer {
	t.Helper()
	tr := &tracer{pid: pid, done: make(chan error, 1)}
	ready := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, which also
		// detaches the tracee if it is still attached.
		runtime.LockOSThread()
		if err := unix.PtraceSeize(pid); err != nil {
			ready <- err
			return
		}
		ready <- nil
		tr.done <- tr.loop()
	}()
	if err := <-ready; err != nil {
		t.Fatalf("PTRACE_SEIZE %d: %v", pid, err)
	}
	t.Cleanup(tr.detach)
	return tr
}

func (tr *tracer) loop() error {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(tr.pid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if ws.Exited() || ws.Signaled() {
			return nil
		}
		if !ws.Stopped() {
			continue
		}
		if tr.quit.Load() {
			return unix.PtraceDetach(tr.pid)
		}
		sig, event := ws.StopSignal(), (uint32(ws)>>16)&0xff
		deliver := 0
		switch {
		case event != 0: // a group-stop or other event stop: resume
		case sig == unix.SIGSTOP:
			tr.suppressed.Add(1)
			ts := unix.NsecToTimespec(int64(tracerDelay))
			unix.Nanosleep(&ts, nil)
		default:
			deliver = int(sig)
		}
		if err := unix.PtraceCont(tr.pid, deliver); err != nil && err != unix.ESRCH {
			return err
		}
	}
}

// detach makes the tracer let go: the tracee is sent SIGWINCH (ignored by
// sleep), and the tracer detaches at the stop that it causes.
func (tr *tracer) detach() {
	if tr.quit.Swap(true) {
		return
	}
	unix.Kill(tr.pid, unix.SIGWINCH)
	select {
	case <-tr.done:
	case <-time.After(waitLimit):
		unix.Kill(tr.pid, unix.SIGKILL)
		<-tr.done
	}
}

// TestPauseUnconfirmedExits4 proves that a pause that cannot be confirmed
// exits 4 and lists pid, state and wchan of what is pending: a launch process
// is held under ptrace by the test, which suppresses every SIGSTOP (the
// tracee shows t for a moment at each one; that must not pass for stopped).
// Afterwards the failed pause has let the launch run again and removed the
// pause file. Three rounds, each must fail the same way.
func TestPauseUnconfirmedExits4(t *testing.T) {
	t.Parallel()
	requireRoot(t, "the test attaches to a process in another session with ptrace")
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg"))
	procs := map[string]proc{"harness": l.role("harness"), "bg": l.role("bg")}
	bg := procs["bg"]
	tr := startTracer(t, bg.PID)
	for round := 1; round <= 3; round++ {
		r := l.verb("pause", "--budget", "300ms", "--d-budget", "500ms")
		wantCode(t, r, 4)
		var res proto.PauseResult
		r.json(t, &res)
		if res.Paused || res.Error == "" {
			t.Errorf("round %d: unconfirmed pause: %+v", round, res)
		}
		var found bool
		for _, p := range res.Pending {
			if p.PID == bg.PID {
				found = true
				if p.State == "" || p.Wchan == "" {
					t.Errorf("round %d: pending entry without state or wchan: %+v", round, p)
				}
			}
		}
		if !found {
			t.Errorf("round %d: pending %+v does not list the traced process %d", round, res.Pending, bg.PID)
		}
		if exists(filepath.Join(l.Dir, proto.PauseFile)) {
			t.Errorf("round %d: the failed pause left its pause file", round)
		}
		waitRunning(t, procs)
	}
	if tr.suppressed.Load() == 0 {
		t.Errorf("the tracer never saw a SIGSTOP")
	}
	tr.detach()
	if rc := l.status(); rc.Ended {
		t.Errorf("the launch ended: %+v", rc)
	}
	l.stop("0s")
}
