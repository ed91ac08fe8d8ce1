package main

// What the supervisor guarantees when it dies: a paused launch stays paused
// (the harness runs in a session of its own), and the processes it adopted
// are still found (it records them in the launch's known set as it goes).

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

func init() {
	fixtures["group-harness"] = fixtureGroupHarness
	fixtures["spin"] = fixtureSpin
	fixtures["escape-harness"] = fixtureEscapeHarness
	fixtures["escape-middle"] = fixtureEscapeMiddle
	fixtures["escaper"] = fixtureEscaper
}

// fixtureGroupHarness records itself as "harness" and starts, in its own
// process group, -n sleeps ("group-I") and a "spin" fixture, and in a session
// of its own one sleep ("setsid"); then it sleeps forever.
func fixtureGroupHarness(args []string) int {
	fl := flag.NewFlagSet("group-harness", flag.ContinueOnError)
	n := fl.Int("n", 3, "sleeps in the harness's group")
	must(fl.Parse(args))
	must(writeRecord("harness", os.Getpid()))
	for i := 0; i < *n; i++ {
		startRecorded("group-"+strconv.Itoa(i), exec.Command("/bin/sleep", "1000"))
	}
	spin := helperProc("spin")
	must(spin.Start())
	go spin.Wait()
	cmd := exec.Command("/bin/sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	startRecorded("setsid", cmd)
	sleepForever()
	return 0
}

// fixtureSpin ignores SIGHUP, records itself as "spin" and burns CPU in short
// bursts forever: a process that runs shows in its CPU time at once.
func fixtureSpin(args []string) int {
	signal.Ignore(unix.SIGHUP)
	must(writeRecord("spin", os.Getpid()))
	for x := 0; ; x++ {
		for end := time.Now().Add(time.Millisecond); time.Now().Before(end); {
			x++
		}
		time.Sleep(4 * time.Millisecond)
	}
}

// fixtureEscapeHarness records itself as "harness", starts "escape-middle"
// and waits for it, then sleeps forever.
func fixtureEscapeHarness(args []string) int {
	must(writeRecord("harness", os.Getpid()))
	must(helperProc("escape-middle").Run())
	sleepForever()
	return 0
}

// fixtureEscapeMiddle starts "escaper" and exits without waiting for it: the
// escaper is orphaned, and adopted by the supervisor.
func fixtureEscapeMiddle(args []string) int {
	must(helperProc("escaper").Start())
	return 0
}

// fixtureEscaper leaves every trace of the launch it can: it starts a
// session of its own, moves itself out of the launch's cgroup (where it can:
// to the parent cgroup, on v2 and on the v1 freezer), records itself as
// "escaper" and becomes a sleep with an empty environment (no tag).
func fixtureEscaper(args []string) int {
	_, err := unix.Setsid()
	must(err)
	leaveLaunchCgroup()
	must(writeRecord("escaper", os.Getpid()))
	must(syscall.Exec("/bin/sleep", []string{"sleep", "1000"}, []string{}))
	return 0
}

// leaveLaunchCgroup moves the calling process from every ngsup-* cgroup it
// is in to that cgroup's parent. Failures are ignored (not root, or no
// cgroup): the test checks where the process ended up.
func leaveLaunchCgroup() {
	data, _ := os.ReadFile("/proc/self/cgroup")
	pid := []byte(strconv.Itoa(os.Getpid()))
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(filepath.Base(parts[2]), "ngsup-") {
			continue
		}
		roots := []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"}
		if parts[1] != "" {
			if !slices.Contains(strings.Split(parts[1], ","), "freezer") {
				continue
			}
			roots = []string{"/sys/fs/cgroup/freezer"}
		}
		for _, root := range roots {
			if os.WriteFile(filepath.Join(root, filepath.Dir(parts[2]), "cgroup.procs"), pid, 0) == nil {
				break
			}
		}
	}
}

// cpuTicks reads the user and system time of pid (fields 14 and 15 of
// /proc/PID/stat), in clock ticks.
func cpuTicks(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(data[bytes.LastIndexByte(data, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("pid %d: %d fields in stat", pid, len(f))
	}
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	utime, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("pid %d: bad cpu times %q %q", pid, f[11], f[12])
	}
	return utime + stime, nil
}

// killSupervisor SIGKILLs the launch's supervisor as its receipt names it,
// through a pidfd opened before its start time is checked, and waits until
// it is gone.
func killSupervisor(t *testing.T, l *launch) proc {
	t.Helper()
	rc, err := proto.ReadReceipt(l.Dir)
	if err != nil {
		t.Fatal(err)
	}
	sup := proc{rc.SupervisorPID, rc.SupervisorStartTicks}
	fd, err := unix.PidfdOpen(sup.PID, 0)
	if err != nil {
		t.Fatalf("open supervisor %v: %v", sup, err)
	}
	defer unix.Close(fd)
	if st, err := readStat(sup.PID); err != nil || st.Start != sup.Start {
		t.Fatalf("supervisor %v is not the receipt's: %+v %v", sup, st, err)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the supervisor to die", func() (bool, string) { return !alive(sup), "alive" })
	return sup
}

// TestPauseHoldsAfterSupervisorKilled proves that a paused launch stays
// paused when its supervisor is SIGKILLed: the harness, the members of its
// process group (one of which ignores SIGHUP and spins) and a child in a
// session of its own all stay alive, in T, and use no CPU time for a second;
// then continue finds and resumes every one, and stop ends every one. (With
// the harness's group in the supervisor's session, the supervisor's death
// orphans that group with stopped members, and the kernel sends it SIGHUP and
// SIGCONT: members die, or run again.)
func TestPauseHoldsAfterSupervisorKilled(t *testing.T) {
	t.Parallel()
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		l.detach(runFlags, helper("group-harness", "-n", "3"))
		procs := map[string]proc{}
		for _, role := range []string{"harness", "group-0", "group-1", "group-2", "spin", "setsid"} {
			procs[role] = l.role(role)
		}
		h := procs["harness"]
		for _, role := range []string{"group-0", "group-1", "group-2", "spin"} {
			if st, _ := readStat(procs[role].PID); st.PGID != h.PID {
				t.Fatalf("fixture: %s should be in the harness's process group %d: %+v", role, h.PID, st)
			}
		}
		l.pause()
		wantHeld(t, procs)
		killSupervisor(t, l)
		cpu := map[string]uint64{}
		for name, p := range procs {
			c, err := cpuTicks(p.PID)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			cpu[name] = c
		}
		for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			for _, name := range sortedKeys(procs) {
				p := procs[name]
				if !alive(p) {
					t.Fatalf("%s %v died after the supervisor was killed", name, p)
				}
				if ok, why := held(p); !ok {
					t.Fatalf("%s runs again after the supervisor was killed: %s", name, why)
				}
			}
		}
		for _, name := range sortedKeys(procs) {
			if c, err := cpuTicks(procs[name].PID); err != nil || c != cpu[name] {
				t.Errorf("%s used CPU time while paused: %d ticks, then %d (%v)", name, cpu[name], c, err)
			}
		}
		res := l.resume()
		if res.Continued < len(procs) {
			t.Errorf("continue resumed %d processes, want at least %d", res.Continued, len(procs))
		}
		waitRunning(t, procs)
		l.stop("1s")
		wantGone(t, procs)
	})
}

// TestStopFindsAdoptedAfterSupervisorKilled proves that a process the
// supervisor adopted is still found by stop once the supervisor is gone,
// although nothing else names it: a double-forked daemon that started a
// session of its own, left the launch's cgroup and cleared its environment
// (so no tag). The supervisor recorded it in the launch's known set when it
// adopted it; `stop --grace 1s` ends it and exits 0.
func TestStopFindsAdoptedAfterSupervisorKilled(t *testing.T) {
	t.Parallel()
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		l.detach(runFlags, helper("escape-harness"))
		h, d := l.role("harness"), l.role("escaper")
		l.own(d) // the cleanup kills it by pid and start time if stop did not
		tag := proto.TagEnv + "=" + l.ID
		testkit.Eventually(t, "the escaper to be adopted by the supervisor and to drop its tag", func() (bool, string) {
			st, err := readStat(d.PID)
			if err != nil || st.Start != d.Start {
				return false, fmt.Sprintf("escaper %v gone: %v", d, err)
			}
			return st.PPID == l.Sup.PID && st.Comm == "sleep" && !environHas(d.PID, tag),
				fmt.Sprintf("ppid %d (supervisor %d), comm %s, tagged %v", st.PPID, l.Sup.PID, st.Comm, environHas(d.PID, tag))
		})
		if st, _ := readStat(d.PID); st.SID != d.PID || st.PGID == h.PID {
			t.Fatalf("fixture: the escaper should lead a session of its own: %+v", st)
		}
		if cg := l.status().Cgroup; cg != "" {
			if bytes.Contains(readFile(fmt.Sprintf("/proc/%d/cgroup", d.PID)), []byte("/"+filepath.Base(cg)+"\n")) {
				t.Fatalf("fixture: the escaper is still in the launch's cgroup %s", cg)
			}
		}
		// Give the supervisor's timer a moment to record it (not an
		// assertion: the stop below is the test).
		line := []byte(fmt.Sprintf("%d ", d.PID))
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if known := readFile(filepath.Join(l.Dir, proto.KnownFile)); bytes.HasPrefix(known, line) || bytes.Contains(known, append([]byte("\n"), line...)) {
				break
			}
		}
		killSupervisor(t, l)
		if !alive(d) {
			t.Fatalf("the escaper %v died with the supervisor", d)
		}
		res := l.stop("1s")
		if alive(d) {
			st, _ := readStat(d.PID)
			t.Fatalf("stop left the adopted daemon %v alive (state %c) and answered %+v", d, st.State, res)
		}
		wantGone(t, map[string]proc{"harness": h})
	})
}

// TestSupervisorStillWhilePaused proves that while a pause holds the launch
// the supervisor does not wake up: it records what it holds on a timer while
// the launch runs, but a pause already recorded that, and a supervisor that
// kept waking would be the one thing in the sandbox still moving. It counts
// the context switches of every thread of the supervisor (each wake-up is
// one) over a stretch of the pause; continue starts the timer again.
func TestSupervisorStillWhilePaused(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg"))
	l.role("harness")
	l.role("bg")
	sup := l.status().SupervisorPID
	l.pause()
	// The supervisor sees the pause file and records once more; how long
	// that takes depends on the machine's load (seen past 200 ms in CI at a
	// load of 100), so wait until it has been quiet for half a second.
	awaitQuiet(t, "the supervisor after the pause", sup, nil)
	if woke := wokeIn(t, sup, 2*time.Second); woke > 2 {
		t.Errorf("the supervisor %d woke up %d times in 2 s of a pause, want none", sup, woke)
	}
	l.resume()
	if woke := wokeIn(t, sup, time.Second); woke < 2 {
		t.Errorf("the supervisor %d woke up %d times in 1 s after the continue: its timer did not start again", sup, woke)
	}
}

// wokeIn counts pid's context switches (each wake-up is one) over d.
func wokeIn(t *testing.T, pid int, d time.Duration) int {
	t.Helper()
	n := ctxtSwitches(t, pid)
	time.Sleep(d)
	return ctxtSwitches(t, pid) - n
}

// awaitQuiet waits until pid (what) has gone 500 ms waking at most once:
// how long it takes to settle after it was last busy depends on the
// machine's load (seen past 200 ms in CI at a load of 100). check, if set,
// runs before each look.
func awaitQuiet(t *testing.T, what string, pid int, check func()) {
	t.Helper()
	testkit.Eventually(t, what+" to settle", func() (bool, string) {
		if check != nil {
			check()
		}
		woke := wokeIn(t, pid, 500*time.Millisecond)
		return woke <= 1, fmt.Sprintf("it woke %d times in the last 500 ms", woke)
	})
}

// ctxtSwitches sums the voluntary and involuntary context switches of every
// thread of pid.
func ctxtSwitches(t *testing.T, pid int) int {
	t.Helper()
	total := 0
	for _, tid := range tids(pid) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				total += n
			}
		}
	}
	if total == 0 {
		t.Fatalf("no context switches read for %d", pid)
	}
	return total
}
