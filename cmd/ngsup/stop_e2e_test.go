package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

// TestStopInterruptThenKill proves that stop sends SIGINT, then SIGKILL
// after the grace: a harness that ignores SIGINT is gone after
// `stop --grace 300ms`, which exits 0 with no survivors and at least one kill,
// and the receipt records death by SIGKILL.
func TestStopInterruptThenKill(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-ignore-int"))
	h := l.role("harness")
	res := l.stop("300ms")
	if res.Killed < 1 || res.Interrupted < 1 || !res.Supervised {
		t.Errorf("stop: killed %d interrupted %d supervised %v, want >=1 >=1 true", res.Killed, res.Interrupted, res.Supervised)
	}
	wantGone(t, map[string]proc{"harness": h})
	rc := l.wait()
	if rc.ExitCode != 128+int(unix.SIGKILL) || rc.Signal != int(unix.SIGKILL) {
		t.Errorf("receipt: exit %d signal %d, want 137 9", rc.ExitCode, rc.Signal)
	}
}

// TestStopPausedLaunch proves that a paused launch is stopped: SIGINT lands
// on stopped processes (stop continues them), so no survivor is left and
// nothing needed SIGKILL, including the processes outside the harness's
// process group.
func TestStopPausedLaunch(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid", "-daemon"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid", "daemon"} {
		procs[role] = l.role(role)
	}
	l.pause()
	wantHeld(t, procs)
	res := l.stop("10s")
	if res.Killed != 0 {
		t.Errorf("stop of a paused launch needed %d SIGKILLs: SIGINT did not land on the stopped processes", res.Killed)
	}
	wantGone(t, procs)
	if rc := l.wait(); rc.ExitCode != 128+int(unix.SIGINT) {
		t.Errorf("receipt: exit %d, want %d (SIGINT)", rc.ExitCode, 128+int(unix.SIGINT))
	}
}

// TestStopAfterSupervisorKilled proves that stop works on a launch whose
// supervisor is gone: it still finds the harness (the receipt), the daemon in
// another session (the tag), a child that cleared its environment (a
// descendant of the harness), and an orphan that cleared its environment
// (neither tagged nor a descendant: only the known set an earlier pause
// recorded names it), and ends them all.
func TestStopAfterSupervisorKilled(t *testing.T) {
	t.Parallel()
	cgroupModes(t, func(t *testing.T, runFlags []string, method string) {
		l := newLaunch(t)
		l.detach(runFlags, helper("harness", "-daemon", "-noenv", "-setsid", "-bg", "-orphan-noenv"))
		procs := map[string]proc{}
		for _, role := range []string{"harness", "daemon", "noenv", "setsid", "bg", "orphan-noenv"} {
			procs[role] = l.role(role)
		}
		// A checkpoint before the crash: its pause records the known set.
		l.pause()
		l.resume()
		sup := proc{l.Sup.PID, l.Sup.StartTicks}
		if st, err := readStat(sup.PID); err != nil || st.Start != sup.Start {
			t.Fatalf("supervisor %v not found", sup)
		}
		if err := unix.Kill(sup.PID, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		wantGone(t, map[string]proc{"supervisor": sup})
		for _, name := range sortedKeys(procs) {
			if ok, why := running(procs[name]); !ok {
				t.Fatalf("fixture: %s", why)
			}
		}
		res := l.stop("1s")
		if res.Supervised || res.Method != proto.MethodScan {
			t.Errorf("stop: supervised %v method %q, want false %q", res.Supervised, res.Method, proto.MethodScan)
		}
		// The reply says the tree could not be searched, and what was.
		if !res.Partial || slices.Contains(res.Searched, proto.SourceTree) ||
			!slices.Contains(res.Searched, proto.SourceTag) || !slices.Contains(res.Searched, proto.SourceKnown) {
			t.Errorf("stop: partial %v searched %v, want true, the tag and the known set, not the tree", res.Partial, res.Searched)
		}
		wantGone(t, procs)
		r := l.verb("wait", "--timeout", "10s")
		wantCode(t, r, 0)
	})
}

// TestStopLeavesOtherLaunchesAlone proves that stopping one launch touches no
// process of another launch in the same sandbox: every process of the other
// is still alive and not stopped. The other launch's id extends the stopped
// one's, so a tag matched by prefix would be caught.
func TestStopLeavesOtherLaunchesAlone(t *testing.T) {
	t.Parallel()
	a, b := newLaunch(t), newLaunch(t)
	b.ID = a.ID + "0"
	roles := []string{"harness", "bg", "setsid", "daemon", "noenv"}
	a.detach(nil, helper("harness", "-bg", "-setsid", "-daemon", "-noenv"))
	b.detach(nil, helper("harness", "-bg", "-setsid", "-daemon", "-noenv"))
	pa, pb := map[string]proc{}, map[string]proc{}
	for _, role := range roles {
		pa[role], pb[role] = a.role(role), b.role(role)
	}
	a.stop("1s")
	wantGone(t, pa)
	for _, name := range sortedKeys(pb) {
		if ok, why := running(pb[name]); !ok {
			t.Errorf("the other launch's %s: %s", name, why)
		}
	}
	if !alive(proc{b.Sup.PID, b.Sup.StartTicks}) {
		t.Errorf("the other launch's supervisor is gone")
	}
	if rc := b.status(); rc.Ended {
		t.Errorf("the other launch ended: %+v", rc)
	}
}

// TestStopLeavesLaunchWithSameIDAlone proves that a stop sweeps by tag only
// when the supervisor is gone: two supervised launches with the same id in
// two folders (ids can collide, and local sandboxes share one pid
// namespace), and a stop of one leaves every process of the other running,
// its supervisor alive and its launch not ended. The stop's reply names the
// sources it searched: the tree, not the tag, and is not partial.
func TestStopLeavesLaunchWithSameIDAlone(t *testing.T) {
	t.Parallel()
	a, b := newLaunch(t), newLaunch(t)
	b.ID = a.ID
	roles := []string{"harness", "bg", "setsid", "daemon", "noenv"}
	a.detach(nil, helper("harness", "-bg", "-setsid", "-daemon", "-noenv"))
	b.detach(nil, helper("harness", "-bg", "-setsid", "-daemon", "-noenv"))
	pa, pb := map[string]proc{}, map[string]proc{}
	for _, role := range roles {
		pa[role], pb[role] = a.role(role), b.role(role)
	}
	res := a.stop("1s")
	wantGone(t, pa)
	for _, name := range sortedKeys(pb) {
		if ok, why := running(pb[name]); !ok {
			t.Errorf("the other launch's %s: %s", name, why)
		}
	}
	if !alive(proc{b.Sup.PID, b.Sup.StartTicks}) {
		t.Errorf("the other launch's supervisor is gone")
	}
	if rc := b.status(); rc.Ended {
		t.Errorf("the other launch ended: %+v", rc)
	}
	if res.Partial || !slices.Contains(res.Searched, proto.SourceTree) || slices.Contains(res.Searched, proto.SourceTag) {
		t.Errorf("stop of a supervised launch: partial %v searched %v, want false, the tree and not the tag", res.Partial, res.Searched)
	}
}

// TestStopBoundedWhenSomethingCannotDie proves that a stop bounds its own
// time and says when it ran out: a process of the launch is moved into a
// cgroup v1 freezer of the test's own and frozen there, where SIGKILL cannot
// end it until it is thawed. `stop --grace 1s` then ends within a generous
// bound, exits 4 listing it, and says out_of_time (the old stop said
// nothing of the kind).
func TestStopBoundedWhenSomethingCannotDie(t *testing.T) {
	t.Parallel()
	requireRoot(t, "a cgroup v1 freezer of the test's own needs root")
	root := "/sys/fs/cgroup/freezer"
	if _, err := os.Stat(filepath.Join(root, "freezer.state")); err != nil {
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
			t.Skip("no cgroup v1 freezer mounted at " + root)
		}
	}
	l := newLaunch(t)
	l.detach([]string{"--no-cgroup"}, helper("harness", "-bg"))
	bg := l.role("bg")
	cg := filepath.Join(root, "ngsup-e2e-unkillable-"+itoa(os.Getpid())+"-"+itoa(bg.PID))
	// Held by a pidfd from now on, while its identity is known: the
	// cleanup's kills below go to it and never to a later holder of its pid.
	bgfd, err := unix.PidfdOpen(bg.PID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := readStat(bg.PID); err != nil || st.Start != bg.Start {
		unix.Close(bgfd)
		t.Fatalf("bg %v is gone before the test began", bg)
	}
	if err := os.Mkdir(cg, 0o755); err != nil {
		unix.Close(bgfd)
		t.Skipf("cannot make a freezer cgroup: %v", err)
	}
	t.Cleanup(func() {
		defer unix.Close(bgfd)
		// Runs before the launch's cleanup: thaw, so its SIGKILL lands.
		os.WriteFile(filepath.Join(cg, "freezer.state"), []byte("THAWED"), 0)
		for try := 0; try < 200 && unix.Rmdir(cg) != nil; try++ {
			unix.PidfdSendSignal(bgfd, unix.SIGKILL, nil, 0)
			time.Sleep(25 * time.Millisecond)
		}
	})
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(itoa(bg.PID)), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cg, "freezer.state"), []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the freezer to freeze", func() (bool, string) {
		state := strings.TrimSpace(string(readFile(filepath.Join(cg, "freezer.state"))))
		return state == "FROZEN", state
	})
	begin := time.Now()
	r := l.verb("stop", "--grace", "1s")
	took := time.Since(begin)
	wantCode(t, r, proto.ExitNotConfirmed)
	var res proto.StopResult
	r.json(t, &res)
	if !res.OutOfTime || res.Stopped || !slices.ContainsFunc(res.Survivors, func(p proto.Pending) bool { return p.PID == bg.PID }) {
		t.Errorf("stop: out_of_time %v stopped %v survivors %v, want true false [%d ...]", res.OutOfTime, res.Stopped, res.Survivors, bg.PID)
	}
	if took > time.Minute {
		t.Errorf("stop took %s: its own bound did not hold", took)
	}
}

// TestStopOfEndedLaunchSaysEnded proves that a stop of a launch that had
// already ended says so (ended), beside partial: its supervisor is gone by
// design, so a partial search is the normal case there, and the driver logs
// it as such instead of warning; a stop of a launch whose supervisor was
// killed mid-run says partial without ended.
func TestStopOfEndedLaunchSaysEnded(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	wantCode(t, l.foreground(nil, plain("/bin/true")), 0)
	res := l.stop("1s")
	if !res.Ended || !res.Partial {
		t.Errorf("stop of an ended launch: ended %v, partial %v, want both: %+v", res.Ended, res.Partial, res)
	}
}

// TestStopPausedRespawningDaemon proves that a stop leaves nothing of a
// paused launch whose daemon respawns its children as they die (a shell's
// `while :; do sleep 3600; done`, as the fake harness's daemon), without a
// cgroup: the harness dies of the SIGINT and its supervisor with it, a
// kill sweep that reaches a child before the daemon lets the daemon fork a
// replacement, and once the daemon is killed that replacement was orphaned
// out of every source (a stop used to say stopped with it alive, 3 of 7
// runs of the driver's commit-with-stop on a real Docker engine).
func TestStopPausedRespawningDaemon(t *testing.T) {
	t.Parallel()
	for run := 0; run < 5; run++ {
		l := newLaunch(t)
		l.detach([]string{"--no-cgroup"}, helper("harness", "-daemon-of", "respawner"))
		l.role("respawner")
		testkit.Eventually(t, "the respawner's children", func() (bool, string) {
			n := len(l.tagged())
			return n >= respawnerKids+2, fmt.Sprintf("%d tagged processes", n)
		})
		l.pause()
		r := l.verb("stop", "--grace", "500ms")
		wantNothingLeft(t, l, r, nil)
	}
}

// TestStopFindsWhatAnInterruptedDaemonStarts proves that a stop finds a
// process born during the stop to a process that then exits by itself: a
// daemon that, on SIGINT, waits for the supervisor that adopted it to be
// gone (or a second), double-forks a sleep in a session of its own with an
// empty environment, and exits. No cgroup, no tag, and its parent gone at
// once: only a supervisor that outlives it can hand it to the stop (it
// used to exit with the harness, and the sleep was left running).
func TestStopFindsWhatAnInterruptedDaemonStarts(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach([]string{"--no-cgroup"}, helper("harness", "-daemon-of", "int-spawner"))
	l.role("int-spawner")
	l.pause()
	r := l.verb("stop", "--grace", "2s")
	late, err := readRecord(filepath.Join(l.Rec, "orphan-noenv"))
	if err != nil {
		t.Fatalf("the daemon did not start its sleep within the grace: %v\n%v", err, r)
	}
	wantNothingLeft(t, l, r, map[string]proc{"orphan-noenv": late})
}

// wantNothingLeft fails the test, printing the stop's reply r, unless the
// stop exited 0 and every process carrying the launch's tag, and every
// process in procs, is gone.
func wantNothingLeft(t *testing.T, l *launch, r outcome, procs map[string]proc) {
	t.Helper()
	var left []string
	for try := 0; try < 100; try++ {
		left = left[:0]
		cands := l.tagged()
		for _, p := range procs {
			cands = append(cands, p)
		}
		for _, p := range cands {
			if st, err := readStat(p.PID); err == nil && alive(p) {
				left = append(left, fmt.Sprintf("%v %s ppid %d sid %d", p, st.Comm, st.PPID, st.SID))
			}
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 || r.code != 0 {
		t.Errorf("after the stop, alive: %v\n%v\nknown set:\n%s", left, r, readFile(filepath.Join(l.Dir, proto.KnownFile)))
	}
}

// TestStopOfACopiedFolderSearchesNothing proves that a stop of a launch
// folder copied by a snapshot or fork of the sandbox (cp -a, as the local
// backend copies, taken while the launch was paused) searches nothing once
// nothing its records name runs: the launch's own folder is stopped (every
// process gone, and that stop is no copy), then `ngsup stop` of the copy
// exits 0 with copied and stopped, no source searched, nothing signalled,
// and no partial. Before origin files it took the copy for the launch's own
// folder with its supervisor gone: it scanned every process on the host for
// the tag and said partial, which the driver warned of after every restore.
func TestStopOfACopiedFolderSearchesNothing(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid", "-daemon"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid", "daemon"} {
		procs[role] = l.role(role)
	}
	l.pause()
	if !exists(filepath.Join(l.Dir, proto.OriginFile)) {
		t.Fatalf("the launch folder holds no %s file", proto.OriginFile)
	}
	fork := filepath.Join(t.TempDir(), "fork", "launch")
	if err := os.MkdirAll(filepath.Dir(fork), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "--reflink=auto", "-T", l.Dir, fork).CombinedOutput(); err != nil {
		t.Fatalf("copy the launch folder: %v: %s", err, out)
	}
	if res := l.stop("0s"); res.Copied {
		t.Errorf("the stop of the launch's own folder says copied: %+v", res)
	}
	wantGone(t, procs)
	r := ngsup(t, "stop", "--dir", fork, "--grace", "0s")
	wantCode(t, r, 0)
	var res proto.StopResult
	r.json(t, &res)
	if !res.Copied || !res.Stopped || res.Interrupted != 0 || res.Killed != 0 || len(res.Searched) != 0 || res.Partial {
		t.Errorf("stop of the copy answered %+v, want copied and stopped, nothing searched or signalled, not partial", res)
	}
}

// TestStopOfAFolderMadeToLookCopiedStillStops proves that an origin file
// is no way out of a stop (the launch folder is the sandbox's to write): a
// launch whose own folder's origin is overwritten to name another folder,
// while its processes run, is stopped as any other: not copied, every
// process gone.
func TestStopOfAFolderMadeToLookCopiedStillStops(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	l.detach(nil, helper("harness", "-bg", "-setsid", "-daemon"))
	procs := map[string]proc{}
	for _, role := range []string{"harness", "bg", "setsid", "daemon"} {
		procs[role] = l.role(role)
	}
	if err := os.WriteFile(filepath.Join(l.Dir, proto.OriginFile), []byte("1 2 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := l.stop("0s"); res.Copied {
		t.Errorf("a live launch whose origin names another folder was taken for a copy: %+v", res)
	}
	wantGone(t, procs)
}

// TestStopAfterSupervisorKilledFindsUntaggedChildrenThatIgnoreSIGINT
// proves that a stop with neither the supervisor nor a cgroup to search
// (the supervisor SIGKILLed, a launch without a cgroup, as in a container)
// still ends a child of the harness that cleared its environment and
// ignores SIGINT (a shell's background job does): the harness dies of the
// stop's SIGINT, and its children are no longer its own for the walks
// after it, so they are learnt before. The stop once signalled the
// harness's group first; the untagged child, orphaned, ran on (seen
// through a real Docker engine).
func TestStopAfterSupervisorKilledFindsUntaggedChildrenThatIgnoreSIGINT(t *testing.T) {
	t.Parallel()
	l := newLaunch(t)
	// A non-interactive shell starts its background jobs with SIGINT
	// ignored; the first clears its environment, tag included.
	l.detach([]string{"--no-cgroup"}, plain("/bin/sh", "-c",
		`env -i /bin/sh -c 'echo $$ >"$0/untagged.pid"; exec sleep 1000' "$`+recEnv+`" </dev/null >/dev/null 2>&1 &
sleep 1000 &
echo $! >"$`+recEnv+`/bg.pid"
while :; do sleep 0.5; done`))
	procs := map[string]proc{}
	for _, role := range []string{"untagged", "bg"} {
		testkit.Eventually(t, role+" to record its pid", func() (bool, string) {
			data, err := os.ReadFile(filepath.Join(l.Rec, role+".pid"))
			if err != nil {
				return false, err.Error()
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil {
				return false, err.Error()
			}
			st, err := readStat(pid)
			if err != nil || !strings.Contains(st.Comm, "sleep") {
				return false, fmt.Sprintf("pid %d not a sleep yet (%v)", pid, err)
			}
			procs[role] = proc{pid, st.Start}
			l.own(procs[role])
			return true, ""
		})
	}
	sup := proc{l.Sup.PID, l.Sup.StartTicks}
	if err := unix.Kill(sup.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wantGone(t, map[string]proc{"supervisor": sup})
	res := l.stop("1s")
	if res.Supervised || !res.Partial {
		t.Errorf("stop: supervised %v partial %v, want false true", res.Supervised, res.Partial)
	}
	wantGone(t, procs)
}
