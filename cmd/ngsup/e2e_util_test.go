package main

// Shared machinery of the end-to-end tests: the ngsup binary built once in
// TestMain, launches started through it, fixtures that are the test binary
// run again as helper processes (see e2e_fixtures_test.go), readers of
// /proc, polling, and the cleanup that ends every process a test started.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/internal/testkit"
	"github.com/ngharness/ngharness/pkg/proto"
)

const (
	// helperEnv names the fixture a re-run of the test binary plays.
	helperEnv = "NGSUP_TEST_HELPER"
	// recEnv is the folder where fixtures record their pids ("pid start"),
	// one file per role.
	recEnv = "NGSUP_TEST_REC"
	// waitLimit bounds every wait on a state: generous, never a speed test.
	waitLimit = 10 * time.Second
	// verbLimit bounds one run of an ngsup verb.
	verbLimit = 90 * time.Second
)

var (
	// ngsupBin is the ngsup binary TestMain built (testkit.Build).
	ngsupBin string
	// testBin is this test binary, run again for the fixtures.
	testBin string
	// launchSeq makes launch ids unique within one test process.
	launchSeq atomic.Int64
)

func TestMain(m *testing.M) {
	if name := os.Getenv(helperEnv); name != "" {
		os.Exit(runHelper(name, os.Args[1:]))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	_, err := testkit.Build("ngsup")
	defer testkit.RemoveBuilt()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ngsupBin = testkit.Bin("ngsup")
	if testBin, err = os.Executable(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The fixtures are this binary run again. Built with -race, each one
	// that exits would sleep a second first (the race runtime's
	// atexit_sleep_ms, 1000 by default), which a fixture's waiters pay for:
	// the harness waits on its short-lived middle process, the test on the
	// harness. They inherit this.
	testkit.HelperExitsAtOnce()
	testkit.Patience = waitLimit
	return m.Run()
}

// requireRoot skips a test whose subject needs root, saying why.
func requireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root (running as uid %d): %s", os.Geteuid(), why)
	}
}

// ---------------------------------------------------------------------------
// Running ngsup.

// outcome is what one run of an ngsup verb gave.
type outcome struct {
	args   []string
	code   int
	stdout string
	stderr string
}

func (r outcome) String() string {
	return fmt.Sprintf("ngsup %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// json decodes the one line of JSON on stdout into v.
func (r outcome) json(t testing.TB, v any) {
	t.Helper()
	out := strings.TrimRight(r.stdout, "\n")
	if out == "" || strings.Contains(out, "\n") {
		t.Fatalf("want one line of JSON on stdout:\n%v", r)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not one %T: %v\n%v", v, err, r)
	}
}

// baseEnv is the environment the tests hand to ngsup: the test's own, less
// anything a fixture or a launch would set.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, helperEnv+"=") || strings.HasPrefix(kv, recEnv+"=") || strings.HasPrefix(kv, proto.TagEnv+"=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// ngsup runs the binary with args and returns what it gave. Output goes
// through pipes; WaitDelay keeps a process that inherited them from holding
// the test.
func ngsup(t testing.TB, args ...string) outcome {
	t.Helper()
	return ngsupEnv(t, nil, args...)
}

// ngsupEnv runs ngsup with extraEnv added to its environment.
func ngsupEnv(t testing.TB, extraEnv []string, args ...string) outcome {
	t.Helper()
	return runNgsup(t, "", extraEnv, args...)
}

// runNgsup runs ngsup in the working folder wd ("" for the test's own).
func runNgsup(t testing.TB, wd string, extraEnv []string, args ...string) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), verbLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, ngsupBin, args...)
	cmd.Env = append(baseEnv(), extraEnv...)
	cmd.Dir = wd
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	r := outcome{args: args, stdout: stdout.String(), stderr: stderr.String(), code: -1}
	var ee *exec.ExitError
	switch {
	case err == nil:
		r.code = 0
	case errors.As(err, &ee) && ee.Exited():
		r.code = ee.ExitCode()
	case ctx.Err() != nil:
		t.Fatalf("ngsup %s did not finish within %s\n%v", strings.Join(args, " "), verbLimit, r)
	case errors.As(err, &ee):
		t.Fatalf("ngsup %s died: %v\n%v", strings.Join(args, " "), err, r)
	case errors.Is(err, exec.ErrWaitDelay):
		r.code = cmd.ProcessState.ExitCode()
	default:
		t.Fatalf("run ngsup %s: %v", strings.Join(args, " "), err)
	}
	for _, bad := range []string{"panic", "goroutine "} {
		if strings.Contains(r.stderr, bad) || strings.Contains(r.stdout, bad) {
			t.Errorf("ngsup printed %q:\n%v", bad, r)
		}
	}
	return r
}

// wantCode fails the test unless r exited with code.
func wantCode(t testing.TB, r outcome, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got:\n%v", code, r)
	}
}

// ---------------------------------------------------------------------------
// Launches.

// command is a harness command line and the environment it needs.
type command struct {
	argv []string
	env  []string
}

// helper is a command that runs the fixture name (e2e_fixtures_test.go).
func helper(name string, args ...string) command {
	return command{argv: append([]string{testBin}, args...), env: []string{helperEnv + "=" + name}}
}

// plain is a command run as it is.
func plain(argv ...string) command { return command{argv: argv} }

// launch is one launch folder used by one test, with the cleanup that ends
// every process of it.
type launch struct {
	t   *testing.T
	Dir string // the launch folder (absolute)
	ID  string // the launch id, unique to this test run
	Rec string // where fixtures record their pids
	Sup proto.DetachResult

	extra []proc // processes the test started itself
	// pauseFlags go before the arguments of every l.pause: a launch with a
	// cgroup is paused with --cgroup-first, so the freeze path is the one
	// tested (by default ngsup freezes only in a fork storm).
	pauseFlags []string
}

// proc is a process identity: pid and start time in clock ticks.
type proc struct {
	PID   int
	Start uint64
}

func (p proc) String() string { return fmt.Sprintf("%d@%d", p.PID, p.Start) }

// newLaunch makes a launch folder and an id for t and registers the cleanup:
// `ngsup stop --grace 0s`, then SIGKILL by pid to every process carrying the
// launch's tag, every process a fixture recorded, every process the test
// registered, and the supervisor, checked by start time, until none is left.
func newLaunch(t *testing.T) *launch {
	t.Helper()
	base := t.TempDir()
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	if len(name) > 60 {
		name = name[:60]
	}
	l := &launch{
		t:   t,
		Dir: filepath.Join(base, "launch"),
		ID:  fmt.Sprintf("e2e-%s-%d-%d", name, os.Getpid(), launchSeq.Add(1)),
		Rec: filepath.Join(base, "rec"),
	}
	if err := os.Mkdir(l.Rec, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.cleanup)
	return l
}

// runArgs is the `ngsup run` command line for cmd, with extra run flags.
func (l *launch) runArgs(detach bool, flags []string, cmd command) []string {
	args := []string{"run", "--dir", l.Dir, "--id", l.ID}
	if detach {
		args = append(args, "--detach")
	}
	args = append(args, flags...)
	return append(append(args, "--"), cmd.argv...)
}

// runEnv is the environment `ngsup run` gets for cmd.
func (l *launch) runEnv(cmd command) []string {
	return append([]string{recEnv + "=" + l.Rec}, cmd.env...)
}

// detach starts cmd as the launch with `ngsup run --detach` and checks what
// it prints.
func (l *launch) detach(flags []string, cmd command) {
	l.t.Helper()
	r := ngsupEnv(l.t, l.runEnv(cmd), l.runArgs(true, flags, cmd)...)
	wantCode(l.t, r, 0)
	r.json(l.t, &l.Sup)
	if !slices.Contains(flags, "--no-cgroup") {
		l.pauseFlags = []string{"--cgroup-first"}
	}
	if l.Sup.ID != l.ID || l.Sup.PID <= 0 || l.Sup.StartTicks == 0 {
		l.t.Fatalf("bad DetachResult %+v for launch %s", l.Sup, l.ID)
	}
}

// foreground runs cmd as the launch with a foreground `ngsup run`.
func (l *launch) foreground(flags []string, cmd command) outcome {
	l.t.Helper()
	return ngsupEnv(l.t, l.runEnv(cmd), l.runArgs(false, flags, cmd)...)
}

// verb runs `ngsup VERB --dir D ARGS...` on the launch.
func (l *launch) verb(name string, args ...string) outcome {
	l.t.Helper()
	return ngsup(l.t, append([]string{name, "--dir", l.Dir}, args...)...)
}

// status returns the launch's receipt as `ngsup status` prints it.
func (l *launch) status() proto.Receipt {
	l.t.Helper()
	r := l.verb("status")
	wantCode(l.t, r, 0)
	var rc proto.Receipt
	r.json(l.t, &rc)
	return rc
}

// wait runs `ngsup wait` and returns the receipt once the launch ended.
func (l *launch) wait() proto.Receipt {
	l.t.Helper()
	r := l.verb("wait", "--timeout", "60s")
	wantCode(l.t, r, 0)
	var rc proto.Receipt
	r.json(l.t, &rc)
	if !rc.Ended {
		l.t.Fatalf("wait exited 0 but the receipt says not ended: %+v", rc)
	}
	return rc
}

// pause runs `ngsup pause` and wants it confirmed.
func (l *launch) pause(args ...string) proto.PauseResult {
	l.t.Helper()
	r := l.verb("pause", append(slices.Clone(l.pauseFlags), args...)...)
	wantCode(l.t, r, 0)
	var res proto.PauseResult
	r.json(l.t, &res)
	if !res.Paused || len(res.Pending) != 0 {
		l.t.Fatalf("pause exited 0 without confirming: %+v", res)
	}
	return res
}

// resume runs `ngsup continue` and wants exit 0.
func (l *launch) resume() proto.ContinueResult {
	l.t.Helper()
	r := l.verb("continue")
	wantCode(l.t, r, 0)
	var res proto.ContinueResult
	r.json(l.t, &res)
	if len(res.Pending) != 0 {
		l.t.Fatalf("continue exited 0 with pending processes: %+v", res)
	}
	return res
}

// stop runs `ngsup stop --grace GRACE` and wants every process gone.
func (l *launch) stop(grace string) proto.StopResult {
	l.t.Helper()
	r := l.verb("stop", "--grace", grace)
	wantCode(l.t, r, 0)
	var res proto.StopResult
	r.json(l.t, &res)
	if !res.Stopped || len(res.Survivors) != 0 {
		l.t.Fatalf("stop exited 0 with survivors: %+v", res)
	}
	return res
}

// role waits until the fixture playing role has recorded itself and returns
// its identity.
func (l *launch) role(role string) proc {
	l.t.Helper()
	var p proc
	testkit.Eventually(l.t, "fixture "+role+" to record its pid", func() (bool, string) {
		var err error
		p, err = readRecord(filepath.Join(l.Rec, role))
		if err == nil {
			return true, ""
		}
		// A harness that failed (a fixture that could not start a child
		// exits 98) starts nothing more: say why at once rather than wait
		// out the limit. One that exited 0 may have left a daemon that
		// records itself later.
		if rc, rerr := proto.ReadReceipt(l.Dir); rerr == nil && rc.Ended && rc.ExitCode != 0 {
			l.t.Fatalf("fixture %s never recorded its pid: the launch ended (exit %d, signal %d, %q); %s", role, rc.ExitCode, rc.Signal, rc.Error, l.diagnose())
		}
		return false, err.Error() + "; " + l.diagnose()
	})
	return p
}

// diagnose says what the launch's processes are doing, for a wait that
// failed: each recorded fixture's state and the tail of the supervisor's
// log, where the harness's own stderr goes.
func (l *launch) diagnose() string {
	var b strings.Builder
	rec := l.recorded()
	for _, name := range sortedKeys(rec) {
		p := rec[name]
		st, err := readStat(p.PID)
		switch {
		case err != nil || st.Start != p.Start:
			fmt.Fprintf(&b, "%s %v gone; ", name, p)
		default:
			fmt.Fprintf(&b, "%s %v state %c wchan %s; ", name, p, st.State, wchanOf(p.PID))
		}
	}
	log := readFile(filepath.Join(l.Dir, proto.SupervisorLogFile))
	if len(log) > 2000 {
		log = log[len(log)-2000:]
	}
	fmt.Fprintf(&b, "supervisor.log: %q", log)
	return b.String()
}

// harness is the launch's harness as the receipt names it.
func (l *launch) harness() proc {
	l.t.Helper()
	var p proc
	testkit.Eventually(l.t, "the receipt to say the harness started", func() (bool, string) {
		rc, err := proto.ReadReceipt(l.Dir)
		if err != nil {
			return false, err.Error()
		}
		if !rc.Started {
			return false, fmt.Sprintf("receipt %+v", rc)
		}
		p = proc{rc.HarnessPID, rc.HarnessStartTicks}
		return true, ""
	})
	return p
}

// own registers a process the test started itself, for the cleanup.
func (l *launch) own(p proc) { l.extra = append(l.extra, p) }

// tagged lists the live processes whose environment carries the launch's tag.
func (l *launch) tagged() []proc {
	return taggedWith(proto.TagEnv + "=" + l.ID)
}

// recorded lists the processes the fixtures recorded.
func (l *launch) recorded() map[string]proc {
	out := map[string]proc{}
	ents, _ := os.ReadDir(l.Rec)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if p, err := readRecord(filepath.Join(l.Rec, e.Name())); err == nil {
			out[e.Name()] = p
		}
	}
	return out
}

// cleanup ends every process of the launch (see newLaunch). It reports a
// process it could not end as a test error.
func (l *launch) cleanup() {
	t := l.t
	if ngsupBin != "" && exists(l.Dir) {
		ctx, cancel := context.WithTimeout(context.Background(), verbLimit)
		cmd := exec.CommandContext(ctx, ngsupBin, "stop", "--dir", l.Dir, "--grace", "0s")
		cmd.Env = baseEnv()
		cmd.WaitDelay = time.Second
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("cleanup: ngsup stop: %v: %s", err, out)
		}
		cancel()
	}
	thawCgroups(l.ID)
	if l.Sup.PID == 0 {
		// The test failed before it read the DetachResult: the receipt
		// names the supervisor.
		if rc, err := proto.ReadReceipt(l.Dir); err == nil && rc.ID == l.ID {
			l.Sup = proto.DetachResult{ID: rc.ID, PID: rc.SupervisorPID, StartTicks: rc.SupervisorStartTicks}
		}
	}
	var left []string
	for try := 0; try < 200; try++ {
		left = left[:0]
		cands := append(l.tagged(), l.extra...)
		for _, p := range l.recorded() {
			cands = append(cands, p)
		}
		if l.Sup.PID > 0 {
			cands = append(cands, proc{l.Sup.PID, l.Sup.StartTicks})
		}
		for _, p := range cands {
			st, err := readStat(p.PID)
			if err != nil || st.Start != p.Start || st.State == 'Z' && st.Threads <= 1 {
				continue
			}
			signalProc(p, unix.SIGKILL)
			left = append(left, fmt.Sprintf("%v %c %s", p, st.State, st.Comm))
		}
		if len(left) == 0 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("cleanup: processes of launch %s still alive: %v", l.ID, left)
	}
	removeCgroups(l.ID)
}

// cgroupsOf lists the cgroups ngsup made for launch id.
func cgroupsOf(id string) []string {
	var out []string
	for _, root := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/freezer"} {
		m, _ := filepath.Glob(filepath.Join(root, "ngsup-"+id+"-*"))
		out = append(out, m...)
	}
	return out
}

// thawCgroups thaws the launch's cgroups, so that SIGKILL lands at once.
func thawCgroups(id string) {
	for _, cg := range cgroupsOf(id) {
		os.WriteFile(filepath.Join(cg, "cgroup.freeze"), []byte("0"), 0)
		os.WriteFile(filepath.Join(cg, "freezer.state"), []byte("THAWED"), 0)
	}
}

// removeCgroups removes the launch's cgroups once they are empty.
func removeCgroups(id string) {
	for _, cg := range cgroupsOf(id) {
		for try := 0; try < 40; try++ {
			if err := unix.Rmdir(cg); err == nil || err == unix.ENOENT {
				break
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
}

// startOwn starts argv as a process of the test itself (not of a launch),
// and registers it with l's cleanup.
// signalProc sends sig to p through a pidfd opened before p's start time
// is checked, so that a pid reused by another process is never signalled.
// It reports whether the signal was sent.
func signalProc(p proc, sig unix.Signal) bool {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if st, err := readStat(p.PID); err != nil || st.Start != p.Start {
		return false
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0) == nil
}

func (l *launch) startOwn(argv ...string) proc {
	l.t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = baseEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	go cmd.Wait()
	st, err := readStat(cmd.Process.Pid)
	if err != nil {
		cmd.Process.Kill()
		l.t.Fatal(err)
	}
	p := proc{cmd.Process.Pid, st.Start}
	l.own(p)
	return p
}

// ---------------------------------------------------------------------------
// /proc.
//
// These tests read /proc with a reader of their own, on purpose: they are
// the oracle for ngsup's reader (pkg/reaper), so they share no code with
// it, nor with internal/proctest, which the other test kits use.

// pstat is what the tests read from /proc/PID/stat or a thread's stat.
type pstat struct {
	PID, PPID, PGID, SID int
	State                byte
	Threads              int
	Start                uint64
	Comm                 string
}

// readStat reads /proc/PID/stat.
func readStat(pid int) (pstat, error) {
	return parseStatFile(fmt.Sprintf("/proc/%d/stat", pid))
}

// readTaskStat reads /proc/PID/task/TID/stat.
func readTaskStat(pid, tid int) (pstat, error) {
	return parseStatFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
}

func parseStatFile(path string) (pstat, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return pstat{}, err
	}
	var s pstat
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || end < open {
		return s, fmt.Errorf("%s: no command name in %q", path, data)
	}
	s.PID, _ = strconv.Atoi(strings.TrimSpace(string(data[:open])))
	s.Comm = string(data[open+1 : end])
	f := strings.Fields(string(data[end+1:]))
	// f[0] is field 3 (state) of proc(5).
	if len(f) < 20 {
		return s, fmt.Errorf("%s: %d fields", path, len(f))
	}
	s.State = f[0][0]
	s.PPID, _ = strconv.Atoi(f[1])
	s.PGID, _ = strconv.Atoi(f[2])
	s.SID, _ = strconv.Atoi(f[3])
	s.Threads, _ = strconv.Atoi(f[17])
	s.Start, _ = strconv.ParseUint(f[19], 10, 64)
	return s, nil
}

// tids lists the threads of pid.
func tids(pid int) []int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// taskChildren lists the children forked by thread tid of pid.
func taskChildren(pid, tid int) []int {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, tid))
	var out []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// environHas reports whether pid's environment holds entry exactly.
func environHas(pid int, entry string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if string(kv) == entry {
			return true
		}
	}
	return false
}

// taggedWith lists the live processes whose environment holds entry.
func taggedWith(entry string) []proc {
	ents, _ := os.ReadDir("/proc")
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !environHas(pid, entry) {
			continue
		}
		if st, err := readStat(pid); err == nil {
			out = append(out, proc{pid, st.Start})
		}
	}
	return out
}

// sigstopPending reports whether SIGSTOP is pending for thread tid of pid,
// in the shared or the thread's own set (ShdPnd, SigPnd).
func sigstopPending(pid, tid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		return false
	}
	const bit = uint64(1) << (unix.SIGSTOP - 1)
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != "ShdPnd" && k != "SigPnd" {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && n&bit != 0 {
			return true
		}
	}
	return false
}

// wchanOf reads where pid sleeps in the kernel.
func wchanOf(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
	return strings.TrimSpace(string(data))
}

// alive reports whether p (pid and start time) exists and is not a dead
// zombie.
func alive(p proc) bool {
	st, err := readStat(p.PID)
	return err == nil && st.Start == p.Start && !(st.State == 'Z' && st.Threads <= 1) && st.State != 'X'
}

func isStoppedState(s byte) bool { return s == 'T' || s == 't' }

// held reports whether p no longer runs code of its own: gone (or its pid
// reused), a zombie with no live thread, or every live thread stopped (T/t)
// or on its way there: SIGSTOP pending for it, or a group stop under way
// (another thread of it stopped). A thread the pause confirmed in an
// uninterruptible call (D) with SIGSTOP pending reads R or S for a moment
// when the call returns, until it takes the stop, which it does before it
// runs an instruction of its own. The string says why not.
func held(p proc) (bool, string) {
	st, err := readStat(p.PID)
	if err != nil || st.Start != p.Start {
		return true, "gone"
	}
	if st.State == 'X' || st.State == 'Z' && st.Threads <= 1 {
		return true, "dead"
	}
	var anyStopped bool
	var moving []int
	states := map[int]byte{}
	for _, tid := range tids(p.PID) {
		ts, err := readTaskStat(p.PID, tid)
		if err != nil {
			continue
		}
		states[tid] = ts.State
		switch {
		case isStoppedState(ts.State):
			anyStopped = true
		case ts.State == 'Z' || ts.State == 'X':
		default:
			moving = append(moving, tid)
		}
	}
	for _, tid := range moving {
		if !anyStopped && !sigstopPending(p.PID, tid) {
			return false, fmt.Sprintf("%v (%s) thread %d in state %c without SIGSTOP pending (threads %s, wchan %s)", p, st.Comm, tid, states[tid], fmtStates(states), wchanOf(p.PID))
		}
	}
	return true, "stopped"
}

// running reports whether p is alive and none of its threads is stopped.
func running(p proc) (bool, string) {
	st, err := readStat(p.PID)
	if err != nil || st.Start != p.Start {
		return false, fmt.Sprintf("%v is gone", p)
	}
	for _, tid := range tids(p.PID) {
		ts, err := readTaskStat(p.PID, tid)
		if err == nil && isStoppedState(ts.State) {
			return false, fmt.Sprintf("%v (%s) thread %d is stopped (%c)", p, st.Comm, tid, ts.State)
		}
	}
	return true, ""
}

func fmtStates(m map[int]byte) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d:%c ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}

// wantHeld fails the test unless every process in procs is held (see held).
func wantHeld(t testing.TB, procs map[string]proc) {
	t.Helper()
	for _, name := range sortedKeys(procs) {
		if ok, why := held(procs[name]); !ok {
			t.Errorf("%s not held by the pause: %s", name, why)
		}
	}
}

// waitRunning waits until every process in procs runs again.
func waitRunning(t testing.TB, procs map[string]proc) {
	t.Helper()
	for _, name := range sortedKeys(procs) {
		p := procs[name]
		testkit.Eventually(t, name+" to run again", func() (bool, string) { return running(p) })
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// ---------------------------------------------------------------------------
// Assertions and modes shared by the verbs' tests.

// cgroupModes runs body once with the launch's cgroup (the default) and once
// with `run --no-cgroup` (signals only).
func cgroupModes(t *testing.T, body func(t *testing.T, runFlags []string, method string)) {
	t.Run("cgroup", func(t *testing.T) {
		t.Parallel()
		requireRoot(t, "ngsup makes the launch's cgroup only as root")
		if !cgroupFreezerMounted() {
			t.Skip("no cgroup2 or cgroup v1 freezer mount: ngsup runs launches without a cgroup here")
		}
		body(t, nil, proto.MethodCgroupSignal)
	})
	t.Run("no-cgroup", func(t *testing.T) {
		t.Parallel()
		body(t, []string{"--no-cgroup"}, proto.MethodSignal)
	})
}

// cgroupFreezerMounted reports whether a cgroup2 or a v1 freezer hierarchy
// is mounted, so that ngsup can make a launch's cgroup.
func cgroupFreezerMounted() bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		_, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(post)
		if !ok || len(f) < 3 {
			continue
		}
		if f[0] == "cgroup2" || f[0] == "cgroup" && slices.Contains(strings.Split(f[2], ","), "freezer") {
			return true
		}
	}
	return false
}

// wantMethod checks the launch's cgroup and the pause's method agree with
// the mode the test runs in.
func wantMethod(t *testing.T, l *launch, res proto.PauseResult, method string) {
	t.Helper()
	rc := l.status()
	if method == proto.MethodCgroupSignal && rc.Cgroup == "" {
		t.Fatalf("the launch has no cgroup as root: %+v", rc)
	}
	if method == proto.MethodSignal && rc.Cgroup != "" {
		t.Fatalf("run --no-cgroup made a cgroup: %+v", rc)
	}
	if res.Method != method || !res.Supervised {
		t.Errorf("pause method %q supervised %v, want %q true", res.Method, res.Supervised, method)
	}
}

// liveThreads lists the threads of pid that are not dead.
func liveThreads(pid int) []int {
	var out []int
	for _, tid := range tids(pid) {
		if ts, err := readTaskStat(pid, tid); err == nil && ts.State != 'Z' && ts.State != 'X' {
			out = append(out, tid)
		}
	}
	return out
}

// taskStates shows the state of every thread of pid.
func taskStates(pid int) string {
	m := map[int]byte{}
	for _, tid := range tids(pid) {
		if ts, err := readTaskStat(pid, tid); err == nil {
			m[tid] = ts.State
		}
	}
	return fmtStates(m)
}

// procSet sorts and dedupes a list of processes.
func procSet(ps []proc) []proc {
	out := slices.Clone(ps)
	slices.SortFunc(out, func(a, b proc) int { return a.PID - b.PID })
	return slices.Compact(out)
}

// minus lists the processes of a that are not in b.
func minus(a, b []proc) []proc {
	var out []proc
	for _, p := range a {
		if !slices.Contains(b, p) {
			out = append(out, p)
		}
	}
	return out
}

// readFile returns the file's bytes, nil when it cannot be read.
func readFile(path string) []byte {
	data, _ := os.ReadFile(path)
	return data
}

// wantGone waits until every process in procs is gone (or a dead zombie).
func wantGone(t *testing.T, procs map[string]proc) {
	t.Helper()
	for _, name := range sortedKeys(procs) {
		p := procs[name]
		testkit.Eventually(t, name+" to be gone", func() (bool, string) {
			st, _ := readStat(p.PID)
			return !alive(p), fmt.Sprintf("%v alive in state %c", p, st.State)
		})
	}
}

// ---------------------------------------------------------------------------
// Records of the fixtures.

// readRecord reads a "pid start" record.
func readRecord(path string) (proc, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return proc{}, err
	}
	a, b, ok := strings.Cut(strings.TrimSpace(string(data)), " ")
	if !ok {
		return proc{}, fmt.Errorf("%s: bad record %q", path, data)
	}
	pid, err1 := strconv.Atoi(a)
	start, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return proc{}, fmt.Errorf("%s: bad record %q", path, data)
	}
	return proc{pid, start}, nil
}

// writeRecord records pid under role in the folder named by recEnv: a temp
// file renamed into place, so a reader never sees half a record.
func writeRecord(role string, pid int) error {
	dir := os.Getenv(recEnv)
	if dir == "" {
		return nil
	}
	st, err := readStat(pid)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+role+".tmp")
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d\n", pid, st.Start), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, role))
}

// touchFile creates an empty file.
func touchFile(t testing.TB, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
