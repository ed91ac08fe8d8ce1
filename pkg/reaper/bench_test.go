package reaper

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
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

// The benchmarks build real trees of sleeping processes under a real
// supervised launch, then time Pause and Continue on them. The supervisor is
// this test binary started again as a helper (see TestMain): Supervise makes
// its caller a child subreaper, which the benchmark process must not become.
//
//	go test -run '^$' -bench Pause -benchtime 5x -count 5 ./pkg/reaper/
//
// Each run of a benchmark builds its tree outside the timer, pauses and
// continues it b.N times, reports ms/pause, ms/continue and processes/op, and
// logs every sample as a "BENCHSAMPLE" line (scripts/bench.sh takes medians
// of those). At the end it stops its launch with Stop and checks that no
// process carrying the launch's tag is left; if the benchmark process dies
// first, the helper notices its lifeline pipe close and stops the launch
// itself.

// helperEnv carries the helper's options (JSON) to the re-executed binary.
const helperEnv = "NGSUP_REAPER_TEST_SUPERVISOR"

// helperOptions is what the helper needs to run Supervise.
type helperOptions struct {
	Dir, ID  string
	Command  []string
	NoCgroup bool
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		os.Exit(runHelperSupervisor(spec))
	}
	if path := os.Getenv(guardEnv); path != "" {
		os.Exit(runCageGuard(path))
	}
	// The benchmarks' supervisors and guards are this binary run again.
	testkit.HelperExitsAtOnce()
	os.Exit(m.Run())
}

// runHelperSupervisor is the detached supervisor of a benchmark launch. Its
// fd 3 is Supervise's ready pipe; fd 4 is the lifeline: the read end of a
// pipe whose write end only the benchmark process holds. EOF on it means the
// benchmark is gone (ended or died), and the launch is stopped.
func runHelperSupervisor(spec string) int {
	var opt helperOptions
	if err := json.Unmarshal([]byte(spec), &opt); err != nil {
		fmt.Fprintf(os.Stderr, "helper: %v\n", err)
		return 2
	}
	os.Unsetenv(helperEnv) // the harness must not run as a helper again
	unix.CloseOnExec(3)
	unix.CloseOnExec(4)
	lifeline := os.NewFile(4, "lifeline")
	go func() {
		io.Copy(io.Discard, lifeline)
		// The benchmark is gone: end the launch. Stop kills this process
		// too once the harness has gone, if it has not exited by then.
		Stop(opt.Dir, 100*time.Millisecond)
		os.Exit(1)
	}()
	code, err := Supervise(RunOptions{
		Dir: opt.Dir, ID: opt.ID, Command: opt.Command,
		Detached: true, NoCgroup: opt.NoCgroup,
		Ready: os.NewFile(3, "ready"),
		Log:   func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) },
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper: %v\n", err)
	}
	return code
}

// benchTree describes a tree of sleeping processes and how to build it.
type benchTree struct {
	name string
	// script is a /bin/sh script; the harness runs `sh script arg`.
	script, arg string
	// processes is how many processes the harness and its descendants make.
	processes int
}

const (
	// flatScript: the harness starts N sleeps and waits.
	flatScript = `n=$1; i=0
while [ "$i" -lt "$n" ]; do sleep 3600 & i=$((i+1)); done
wait
`
	// fanScript N: this process and N-1 descendants, at most 4 children per
	// process, every child a fresh exec of this script (fork+exec at every
	// level); the leaves exec sleep.
	fanScript = `n=$1
[ "$n" -le 1 ] && exec sleep 3600
rest=$((n-1)); k=4; [ "$rest" -lt 4 ] && k=$rest
i=0
while [ "$i" -lt "$k" ]; do
	share=$((rest / k)); [ "$i" -lt $((rest % k)) ] && share=$((share+1))
	/bin/sh "$0" "$share" &
	i=$((i+1))
done
wait
`
	// chainScript N: a chain N deep, each level a fresh exec of this
	// script that starts the next and waits; the last level execs sleep.
	chainScript = `n=$1
[ "$n" -le 1 ] && exec sleep 3600
/bin/sh "$0" $((n-1)) &
wait
`
)

var (
	treeFlat  = benchTree{name: "flat1000", script: flatScript, arg: "1000", processes: 1001}
	treeFan   = benchTree{name: "fanout4-2400", script: fanScript, arg: "2400", processes: 2400}
	treeChain = benchTree{name: "chain2400", script: chainScript, arg: "2400", processes: 2400}
)

// benchLaunch is one supervised launch holding a built tree.
type benchLaunch struct {
	dir, id  string
	tag      string
	helper   *exec.Cmd
	lifeline *os.File
	sup      proto.Proc
}

func skipUnlessRoot(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("the reaper benchmarks need root (cgroups of their own, thousands of processes); run as root")
	}
}

// startBenchLaunch starts a supervised launch running tree and waits until
// every process of the tree exists and sleeps. It registers the launch's
// stop with b.Cleanup, so a failing benchmark leaves nothing behind.
func startBenchLaunch(b testing.TB, tree benchTree) *benchLaunch {
	b.Helper()
	bl := startSupervised(b, tree, launchOptions{cgroupFD: -1})
	bl.waitBuilt(b, tree.processes, 5*time.Minute)
	return bl
}

// launchOptions are the ways a benchmark's launch differs from the default.
type launchOptions struct {
	// noCgroup: the launch gets no cgroup (ngsup run --no-cgroup).
	noCgroup bool
	// cgroupFD, unless -1, is an open cgroup2 folder the supervisor is
	// started in (CLONE_INTO_CGROUP), so nothing it starts is outside it.
	cgroupFD int
	// end, if set, ends the launch at the cleanup instead of stop.
	end func(*benchLaunch, testing.TB)
	// command, if set, is the harness's argv instead of the tree's script.
	command []string
	// pauseFirst makes the launch folder with a pause file in it before
	// the supervisor starts, so that it waits (a pending launch).
	pauseFirst bool
}

// startSupervised starts the helper supervisor of a launch running tree and
// waits for its ready line, not for the tree. Its cleanup (lo.end, else
// stop) is registered as soon as the helper runs.
func startSupervised(b testing.TB, tree benchTree, lo launchOptions) *benchLaunch {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	script := filepath.Join(root, tree.name+".sh")
	if err := os.WriteFile(script, []byte(tree.script), 0o755); err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(root, "launch")
	id := fmt.Sprintf("bench-%s-%d-%d", tree.name, os.Getpid(), time.Now().UnixNano())
	argv := append([]string{"/bin/sh", script}, strings.Fields(tree.arg)...)
	if lo.command != nil {
		argv = lo.command
	}
	if lo.pauseFirst {
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, proto.PauseFile), []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	spec, err := json.Marshal(helperOptions{Dir: dir, ID: id, Command: argv, NoCgroup: lo.noCgroup})
	if err != nil {
		b.Fatal(err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(root, "helper.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{readyW, lifeR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if lo.cgroupFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, lo.cgroupFD
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	readyW.Close()
	lifeR.Close()
	logf.Close()
	bl := &benchLaunch{dir: dir, id: id, tag: proto.TagEnv + "=" + id, helper: cmd, lifeline: lifeW}
	end := lo.end
	if end == nil {
		end = (*benchLaunch).stop
	}
	b.Cleanup(func() { end(bl, b) })
	line, _ := bufio.NewReader(readyR).ReadString('\n')
	readyR.Close()
	if strings.TrimSpace(line) != "ok" {
		log, _ := os.ReadFile(filepath.Join(root, "helper.log"))
		b.Fatalf("the supervisor did not start: %q; its log: %s", line, log)
	}
	r, err := proto.ReadReceipt(dir)
	if err != nil {
		b.Fatal(err)
	}
	bl.sup = proto.Proc{PID: r.SupervisorPID, StartTicks: r.SupervisorStartTicks}
	return bl
}

// waitBuilt waits until the supervisor's tree holds want processes (besides
// the supervisor), every one of them asleep, twice in a row.
func (bl *benchLaunch) waitBuilt(b testing.TB, want int, budget time.Duration) {
	b.Helper()
	deadline := time.Now().Add(budget)
	steady := 0
	for {
		n, sleeping := bl.count()
		if n == want && sleeping == want {
			steady++
			if steady == 2 {
				return
			}
		} else {
			steady = 0
		}
		if time.Now().After(deadline) {
			b.Fatalf("the tree has %d processes (%d asleep) after %s, want %d", n, sleeping, budget, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// count walks the supervisor's tree: how many processes, how many asleep.
func (bl *benchLaunch) count() (n, sleeping int) {
	queue := []int{bl.sup.PID}
	var kids []int
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		st, err := ProcFS.ReadStat(pid)
		if err != nil {
			continue
		}
		if pid != bl.sup.PID {
			n++
			if st.State == 'S' {
				sleeping++
			}
		}
		kids, _ = ProcFS.Children(pid, st.NumThreads, kids[:0])
		queue = append(queue, kids...)
	}
	return n, sleeping
}

// stop ends the launch and checks that nothing of it is left. Whatever a
// failed Stop leaves is killed by pid, found by the launch's own tag.
func (bl *benchLaunch) stop(b testing.TB) {
	res, code, err := Stop(bl.dir, 200*time.Millisecond)
	if err != nil || code != proto.ExitOK || !res.Stopped {
		b.Errorf("stop the launch: code %d, %v, survivors %v", code, err, res.Survivors)
	}
	bl.lifeline.Close()
	done := make(chan error, 1)
	go func() { done <- bl.helper.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		b.Errorf("the supervisor (pid %d) did not exit after the stop", bl.helper.Process.Pid)
		bl.helper.Process.Kill()
		<-done
	}
	// Nothing carrying the launch's tag may be left.
	for range 50 {
		left := bl.tagged()
		if len(left) == 0 {
			return
		}
		for _, p := range left {
			ProcFS.Signal(p, unix.SIGKILL)
		}
		if cg := bl.cgroup(); cg != nil {
			cg.Thaw()
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Errorf("processes of launch %s left after the stop: %v", bl.id, bl.tagged())
}

func (bl *benchLaunch) cgroup() *Cgroup {
	r, err := proto.ReadReceipt(bl.dir)
	if err != nil {
		return nil
	}
	return OpenCgroup(r.Cgroup, r.CgroupVersion)
}

// tagged lists the live processes carrying the launch's tag.
func (bl *benchLaunch) tagged() []proto.Proc {
	pids, _ := ProcFS.PIDs()
	var out []proto.Proc
	for _, pid := range pids {
		if !ProcFS.HasEnv(pid, bl.tag) {
			continue
		}
		if st, err := ProcFS.ReadStat(pid); err == nil && (st.State != 'Z' || st.NumThreads > 1) {
			out = append(out, procOf(st))
		}
	}
	return out
}

func benchmarkPause(b *testing.B, tree benchTree, opt PauseOptions) {
	skipUnlessRoot(b)
	bl := startBenchLaunch(b, tree)
	// default: the pause as ngsup runs it (signals; the cgroup only in a
	// fork storm, which sleeping trees are not); cgroup: freeze first;
	// signal: never the cgroup.
	method, wantMethod := "default", proto.MethodSignal
	switch {
	case opt.CgroupFirst:
		method, wantMethod = "cgroup", proto.MethodCgroupSignal
	case opt.NoCgroup:
		method = "signal"
	}
	r, err := proto.ReadReceipt(bl.dir)
	if err != nil {
		b.Fatal(err)
	}
	if opt.CgroupFirst && r.Cgroup == "" {
		b.Skip("the launch got no cgroup here; the cgroup benchmark needs one")
	}
	var pauses, conts []float64
	processes := 0
	for b.Loop() {
		begin := time.Now()
		pres, code, err := Pause(bl.dir, opt)
		pauseMS := ms(time.Since(begin))
		if err != nil || code != proto.ExitOK || !pres.Paused {
			b.Fatalf("pause: code %d, %v, %+v", code, err, pres)
		}
		begin = time.Now()
		cres, code, err := Continue(bl.dir)
		contMS := ms(time.Since(begin))
		if err != nil || code != proto.ExitOK {
			b.Fatalf("continue: code %d, %v, %+v", code, err, cres)
		}
		if pres.Processes != tree.processes || pres.Method != wantMethod {
			b.Fatalf("pause held %d processes by %q, want %d by %q", pres.Processes, pres.Method, tree.processes, wantMethod)
		}
		processes = pres.Processes
		pauses = append(pauses, pauseMS)
		conts = append(conts, contMS)
		b.Logf("BENCHSAMPLE tree=%s method=%s cgroup_v=%d pause_ms=%.3f continue_ms=%.3f processes=%d passes=%d continued=%d",
			tree.name, method, r.CgroupVersion, pauseMS, contMS, pres.Processes, pres.Passes, cres.Continued)
	}
	b.ReportMetric(mean(pauses), "ms/pause")
	b.ReportMetric(mean(conts), "ms/continue")
	b.ReportMetric(median(pauses), "median-ms/pause")
	b.ReportMetric(float64(processes), "processes/op")
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func BenchmarkPauseFlat1000Default(b *testing.B) { benchmarkPause(b, treeFlat, PauseOptions{}) }
func BenchmarkPauseFlat1000Cgroup(b *testing.B) {
	benchmarkPause(b, treeFlat, PauseOptions{CgroupFirst: true})
}
func BenchmarkPauseFlat1000Signal(b *testing.B) {
	benchmarkPause(b, treeFlat, PauseOptions{NoCgroup: true})
}
func BenchmarkPauseFanout2400Default(b *testing.B) { benchmarkPause(b, treeFan, PauseOptions{}) }
func BenchmarkPauseFanout2400Cgroup(b *testing.B) {
	benchmarkPause(b, treeFan, PauseOptions{CgroupFirst: true})
}
func BenchmarkPauseFanout2400Signal(b *testing.B) {
	benchmarkPause(b, treeFan, PauseOptions{NoCgroup: true})
}
func BenchmarkPauseChain2400Default(b *testing.B) { benchmarkPause(b, treeChain, PauseOptions{}) }
func BenchmarkPauseChain2400Cgroup(b *testing.B) {
	benchmarkPause(b, treeChain, PauseOptions{CgroupFirst: true})
}
func BenchmarkPauseChain2400Signal(b *testing.B) {
	benchmarkPause(b, treeChain, PauseOptions{NoCgroup: true})
}

// TestBenchTreeScripts builds small versions of the three benchmark trees
// under a real launch and checks their shapes, so the benchmarks' trees are
// tested where the suite runs (as root).
func TestBenchTreeScripts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, like the benchmarks")
	}
	for _, tc := range []struct {
		tree      benchTree
		maxDepth  int
		maxFanout int
	}{
		{benchTree{name: "flat", script: flatScript, arg: "20", processes: 21}, 1, 20},
		{benchTree{name: "fan", script: fanScript, arg: "30", processes: 30}, 3, 4},
		{benchTree{name: "chain", script: chainScript, arg: "12", processes: 12}, 11, 1},
	} {
		t.Run(tc.tree.name, func(t *testing.T) {
			bl := startBenchLaunch(t, tc.tree)
			res, err := TreeFromPID(bl.sup.PID)
			if err != nil {
				t.Fatal(err)
			}
			depth := map[int]int{bl.sup.PID: -1}
			kids := map[int]int{}
			maxDepth, maxFanout := 0, 0
			for _, p := range res.Processes { // parents come before children
				if p.PID == bl.sup.PID {
					continue
				}
				depth[p.PID] = depth[p.PPID] + 1
				maxDepth = max(maxDepth, depth[p.PID])
				if p.PPID != bl.sup.PID {
					kids[p.PPID]++
					maxFanout = max(maxFanout, kids[p.PPID])
				}
			}
			if len(res.Processes)-1 != tc.tree.processes || maxDepth != tc.maxDepth || maxFanout > tc.maxFanout {
				t.Fatalf("%d processes, depth %d, fan-out %d; want %d, %d, at most %d",
					len(res.Processes)-1, maxDepth, maxFanout, tc.tree.processes, tc.maxDepth, tc.maxFanout)
			}
		})
	}
}

// TestBenchLaunchLifeline: a benchmark process that dies without running its
// cleanups (killed, or a panic) leaves nothing behind: its helper supervisor
// sees the lifeline close and stops the launch.
func TestBenchLaunchLifeline(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, like the benchmarks")
	}
	if os.Getenv("NGSUP_REAPER_TEST_LIFELINE") != "" {
		// The child: build a launch, say who it is, and hang until killed.
		bl := startBenchLaunch(t, benchTree{name: "life", script: fanScript, arg: "15", processes: 15})
		fmt.Printf("LAUNCH %s %d\n", bl.dir, bl.sup.PID)
		select {}
	}
	var dir string
	var sup int
	cmd := startSelf(t, "TestBenchLaunchLifeline", "NGSUP_REAPER_TEST_LIFELINE", func(line string) bool {
		_, err := fmt.Sscanf(line, "LAUNCH %s %d", &dir, &sup)
		return err == nil
	})
	if dir == "" {
		t.Fatal("the child never reported its launch")
	}
	r, err := proto.ReadReceipt(dir)
	if err != nil {
		t.Fatal(err)
	}
	bl := &benchLaunch{dir: dir, id: r.ID, tag: proto.TagEnv + "=" + r.ID}
	if n := len(bl.tagged()); n != 15 {
		t.Fatalf("%d tagged processes before the kill, want 15", n)
	}
	cmd.Process.Kill() // no cleanup runs in the child
	cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for len(bl.tagged()) > 0 || ProcFS.Alive(proto.Proc{PID: r.SupervisorPID, StartTicks: r.SupervisorStartTicks}) {
		if time.Now().After(deadline) {
			left := bl.tagged()
			for _, p := range left {
				ProcFS.Signal(p, unix.SIGKILL)
			}
			t.Fatalf("30 s after the benchmark process died, %d processes of its launch are left", len(left))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r, err := proto.ReadReceipt(dir); err != nil || !r.Ended {
		t.Fatalf("the receipt does not record the end: %+v, %v", r, err)
	}
	// The child's temp folder (its cleanup never ran).
	if top := filepath.Dir(filepath.Dir(dir)); strings.HasPrefix(filepath.Base(top), "TestBenchLaunchLifeline") {
		os.RemoveAll(top)
	}
}

// startSelf runs this test binary again as a child running only test, with
// env set to 1 (the child's side of the test), and reads its stdout until
// report accepts a line. The child is killed at cleanup if the test has not
// killed it already.
func startSelf(t *testing.T, test, env string, report func(line string) bool) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^"+test+"$", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), env+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && !report(sc.Text()) {
	}
	return cmd
}

// BenchmarkPauseBatch64 pauses 64 launches of 7 processes each (a harness
// and 6 children, the soak's launch) in one call, as `ngsup pause` given
// 64 --dir does, two ways in alternating rounds of one run: "each" pauses
// every launch on its own, BatchWorkers at once, as Pause alone would;
// "all" is PauseAll, which begins every pause (SIGSTOP to each harness's
// group) before it confirms any. It reports the median of each, in ms per
// batch and per launch, and logs every round as a BENCHSAMPLE line.
func BenchmarkPauseBatch64(b *testing.B) {
	skipUnlessRoot(b)
	const n = 64
	tree := benchTree{name: "flat6", script: flatScript, arg: "6", processes: 7}
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = startSupervised(b, tree, launchOptions{cgroupFD: -1}).dir
	}
	for _, d := range dirs {
		bl := &benchLaunch{dir: d}
		r, err := proto.ReadReceipt(d)
		if err != nil {
			b.Fatal(err)
		}
		bl.sup = proto.Proc{PID: r.SupervisorPID, StartTicks: r.SupervisorStartTicks}
		bl.waitBuilt(b, tree.processes, time.Minute)
	}
	check := func(how string, res proto.PauseResult, code int, err error) {
		if err != nil || code != proto.ExitOK || !res.Paused || res.Processes != tree.processes {
			b.Fatalf("%s: code %d, %v, %+v", how, code, err, res)
		}
	}
	continueAll := func() {
		Each(n, BatchWorkers, func(i int) {
			if _, code, err := Continue(dirs[i]); err != nil || code != proto.ExitOK {
				b.Errorf("continue %s: code %d, %v", dirs[i], code, err)
			}
		}, func(int) {})
	}
	var each, all []float64
	for b.Loop() {
		begin := time.Now()
		Each(n, BatchWorkers, func(i int) {
			res, code, err := Pause(dirs[i], PauseOptions{})
			check("each", res, code, err)
		}, func(int) {})
		eachMS := ms(time.Since(begin))
		continueAll()
		begin = time.Now()
		PauseAll(dirs, PauseOptions{}, BatchWorkers, func(i int, res proto.PauseResult, code int, err error) {
			check("all", res, code, err)
		})
		allMS := ms(time.Since(begin))
		continueAll()
		each, all = append(each, eachMS), append(all, allMS)
		b.Logf("BENCHSAMPLE batch=%d each_ms=%.3f all_ms=%.3f", n, eachMS, allMS)
	}
	b.ReportMetric(median(each), "each-ms/batch")
	b.ReportMetric(median(all), "all-ms/batch")
	b.ReportMetric(median(each)/n, "each-ms/launch")
	b.ReportMetric(median(all)/n, "all-ms/launch")
}
