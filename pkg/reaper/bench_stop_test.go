package reaper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ngharness/ngharness/pkg/proto"
)

// Two more benchmarks on real supervised launches (see bench_test.go):
//
//	go test -run '^$' -bench 'StopStorm|SupervisorIdle' -benchtime 3x -count 3 ./pkg/reaper/
//
// BenchmarkStopStorm*: the stop of a fork storm whose supervisor is gone
// (issue 9, finding 6). Each iteration builds a storm of stormMembers shells,
// each in a session of its own and replacing itself every second by a
// successor that calls setsid again, under a supervised launch (with its
// cgroup, or with none: NoCgroup); SIGKILLs the supervisor; then times
// StopLaunch(dir, "", 1s). It logs a BENCHSAMPLE line per stop (the time, the
// reply's stopped, out_of_time and survivors, and the processes really left
// in the storm's cgroup). With NGSUP_BENCH_STOP_BIN=PATH the stop is that
// ngsup binary's `stop --dir D --grace 1s` instead (how an older ngsup is
// measured on the same storm).
//
// A storm's members leave every process group and session, so the
// benchmark contains each storm in a cgroup of its own (a cage): the
// supervisor is started in it (CLONE_INTO_CGROUP), the launch's cgroup is
// made below it, and at the end cgroup.kill empties it. The cage is cleared
// by a guard process holding a lifeline pipe from the benchmark, so it is
// cleared too when the benchmark dies without running its cleanups.
//
// BenchmarkSupervisorIdleFlat1000: the CPU an idle supervisor of the flat
// 1,000 tree uses over idleWindow, while the launch runs (it records its
// children every recordEvery) and while a pause holds it (it does not wake).

const (
	// stormScript N HOP [member]: the harness starts N-1 members in a
	// fan-out (at most 4 children each, every one through setsid), then
	// sleeps, so the supervisor lives until it is killed. A member starts
	// its share of the members, sleeps HOP seconds, starts its successor
	// through setsid (a new session, a new pid, no parent) and exits.
	stormScript = `n=$1 hop=$2
rest=$((n-1)); k=4; [ "$rest" -lt 4 ] && k=$rest
i=0
while [ "$i" -lt "$k" ]; do
	share=$((rest / k)); [ "$i" -lt $((rest % k)) ] && share=$((share+1))
	setsid /bin/sh "$0" "$share" "$hop" member &
	i=$((i+1))
done
[ "$3" = member ] || exec sleep 3600
sleep "$hop"
setsid /bin/sh "$0" 1 "$hop" member &
`
	// stormMembers is the storm's size: about 2 processes per member (the
	// shell and its sleep), 2,000 in all.
	stormMembers = 1000
	// stormGrace is the stop's grace, as in the issue (--grace 1s).
	stormGrace = time.Second
	// stopBinEnv names an ngsup binary whose stop is timed instead of
	// StopLaunch in this process.
	stopBinEnv = "NGSUP_BENCH_STOP_BIN"
	// guardEnv carries a cage's path to the re-executed binary that guards it.
	guardEnv = "NGSUP_REAPER_TEST_CAGE_GUARD"
	// idleWindow is how long the idle supervisor is watched, each way.
	idleWindow = 10 * time.Second
)

// treeStorm is the storm: the harness's sleep and 999 members of 2 processes.
var treeStorm = benchTree{name: "storm1000", script: stormScript, arg: strconv.Itoa(stormMembers) + " 1",
	processes: 2*stormMembers - 1}

// cage is a cgroup2 cgroup of the benchmark's own holding one storm.
type cage struct {
	path     string
	dir      *os.File // the open folder, for CLONE_INTO_CGROUP
	guard    *exec.Cmd
	lifeline *os.File
	once     sync.Once
}

// newCage makes a cage and its guard, and registers its clearing with
// b.Cleanup. It skips the benchmark where no cgroup2 cgroup with cgroup.kill
// can be made.
func newCage(b testing.TB) *cage {
	b.Helper()
	cg, err := CreateCgroup(fmt.Sprintf("ngsup-bench-cage-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err != nil {
		b.Skipf("the storm benchmarks need a cgroup of their own to contain the storm: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cg.Path, "cgroup.kill")); cg.Version != 2 || err != nil {
		cg.Remove()
		b.Skipf("the storm benchmarks need a cgroup2 cgroup with cgroup.kill (Linux 5.14+) to contain the storm; got %s", cg.Path)
	}
	self, err := os.Executable()
	if err != nil {
		cg.Remove()
		b.Fatal(err)
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		cg.Remove()
		b.Fatal(err)
	}
	guard := exec.Command(self)
	guard.Env = append(os.Environ(), guardEnv+"="+cg.Path)
	guard.Stdin, guard.Stderr = lifeR, os.Stderr
	// Its own session: a ^C to the benchmark's group does not reach it.
	guard.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	err = guard.Start()
	lifeR.Close()
	if err != nil {
		lifeW.Close()
		cg.Remove()
		b.Fatal(err)
	}
	c := &cage{path: cg.Path, guard: guard, lifeline: lifeW}
	b.Cleanup(func() { c.clear(b) })
	if c.dir, err = os.Open(cg.Path); err != nil {
		b.Fatal(err)
	}
	return c
}

// procs lists the processes in the cage and in every cgroup below it.
func (c *cage) procs() []int {
	var out []int
	filepath.WalkDir(c.path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			if cg := OpenCgroup(p, 2); cg == nil {
				return nil
			} else if pids, err := cg.Procs(); err == nil {
				out = append(out, pids...)
			}
		}
		return nil // a cgroup removed meanwhile is skipped
	})
	return out
}

// clear has the guard kill everything in the cage and remove it, and checks
// that it did. It runs once.
func (c *cage) clear(b testing.TB) {
	c.once.Do(func() {
		if c.dir != nil {
			c.dir.Close()
		}
		c.lifeline.Close()
		done := make(chan error, 1)
		go func() { done <- c.guard.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("the guard of cage %s: %v", c.path, err)
			}
		case <-time.After(time.Minute):
			b.Errorf("the guard of cage %s did not end in a minute", c.path)
			c.guard.Process.Kill()
			<-done
			emptyCage(c.path, 10*time.Second)
		}
		if _, err := os.Stat(c.path); err == nil {
			b.Errorf("cage %s is left, holding %d processes", c.path, len(c.procs()))
		}
	})
}

// runCageGuard is the guard of the cage at path: once its stdin (the
// lifeline) closes, the benchmark has ended or died, and the cage is emptied
// and removed.
func runCageGuard(path string) int {
	io.Copy(io.Discard, os.Stdin)
	if err := emptyCage(path, 30*time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "cage guard: %v\n", err)
		return 1
	}
	return 0
}

// emptyCage kills every process in the cgroup at path and below it
// (cgroup.kill kills a cgroup's descendants too) and removes those cgroups,
// the deepest first, until path is gone or budget has passed.
func emptyCage(path string, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	for {
		if cg := OpenCgroup(path, 2); cg != nil {
			cg.Kill()
		}
		var dirs []string
		filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			unix.Rmdir(dirs[i]) // EBUSY while members are on their way out
		}
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s is still there after %s", path, budget)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// storm is one built storm: its cage and its launch.
type storm struct {
	cage   *cage
	launch *benchLaunch
	// built is how many processes the cage held when the supervisor was killed.
	built int
	// load is the 1-minute load average before the storm was built.
	load string
	// reaped: the helper supervisor was waited for.
	reaped bool
}

// startStorm builds the storm tree under a supervised launch (its own
// cgroup unless noCgroup), waits until 90 % of its processes exist, and
// SIGKILLs the supervisor. Everything is cleared at b's cleanup, or by end.
func startStorm(b testing.TB, tree benchTree, noCgroup bool) *storm {
	b.Helper()
	s := &storm{cage: newCage(b), load: "-"}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		s.load = strings.Fields(string(data))[0]
	}
	s.launch = startSupervised(b, tree, launchOptions{
		noCgroup: noCgroup,
		cgroupFD: int(s.cage.dir.Fd()),
		end:      func(*benchLaunch, testing.TB) { s.end(b) },
	})
	want := tree.processes * 9 / 10
	deadline := time.Now().Add(2 * time.Minute)
	for s.built = len(s.cage.procs()); s.built < want; s.built = len(s.cage.procs()) {
		if time.Now().After(deadline) {
			b.Fatalf("the storm has %d processes after 2 minutes, want %d", s.built, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The supervisor, by pid and start time (Signal checks both).
	if err := ProcFS.Signal(s.launch.sup, unix.SIGKILL); err != nil {
		b.Fatalf("SIGKILL the supervisor %d: %v", s.launch.sup.PID, err)
	}
	s.launch.helper.Wait()
	s.reaped = true
	return s
}

// end clears the storm's cage (its supervisor too, if it still runs).
func (s *storm) end(b testing.TB) {
	s.cage.clear(b)
	s.launch.lifeline.Close()
	if !s.reaped {
		s.launch.helper.Wait()
		s.reaped = true
	}
}

// stopStorm stops the launch in dir as the benchmark measures it: StopLaunch
// in this process, or the stop of the ngsup binary bin.
func stopStorm(dir, bin string) (proto.StopResult, int, error) {
	if bin == "" {
		return StopLaunch(dir, "", stormGrace)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "stop", "--dir", dir, "--grace", stormGrace.String())
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var res proto.StopResult
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return res, -1, err
	}
	if jerr := json.Unmarshal(out.Bytes(), &res); jerr != nil {
		return res, cmd.ProcessState.ExitCode(), fmt.Errorf("%s stop: %v; stderr: %s", bin, jerr, strings.TrimSpace(errb.String()))
	}
	return res, cmd.ProcessState.ExitCode(), nil
}

func benchmarkStopStorm(b *testing.B, noCgroup bool) {
	skipUnlessRoot(b)
	method := "cgroup"
	if noCgroup {
		method = "no-cgroup"
	}
	bin := os.Getenv(stopBinEnv)
	stopper := "in-process"
	if bin != "" {
		stopper = filepath.Base(bin)
	}
	var stops, lefts []float64
	stopped, outOfTime, processes := 0, 0, 0
	for b.Loop() {
		b.StopTimer()
		s := startStorm(b, treeStorm, noCgroup)
		b.StartTimer()
		begin := time.Now()
		res, code, err := stopStorm(s.launch.dir, bin)
		stopMS := ms(time.Since(begin))
		b.StopTimer()
		left := len(s.cage.procs())
		s.end(b) // the next storm starts on an empty machine
		if err != nil {
			b.Fatalf("stop: code %d, %v", code, err)
		}
		if res.Stopped {
			stopped++
		}
		if res.OutOfTime {
			outOfTime++
		}
		stops = append(stops, stopMS)
		lefts = append(lefts, float64(left))
		processes = s.built
		b.Logf("BENCHSAMPLE tree=%s method=%s stopper=%s stop_ms=%.1f exit=%d stopped=%d out_of_time=%d survivors=%d left=%d interrupted=%d killed=%d processes=%d load1=%s",
			treeStorm.name, method, stopper, stopMS, code, b2i(res.Stopped), b2i(res.OutOfTime), len(res.Survivors), left,
			res.Interrupted, res.Killed, s.built, s.load)
		b.StartTimer()
	}
	n := float64(len(stops))
	b.ReportMetric(median(stops), "median-ms/stop")
	b.ReportMetric(float64(stopped)/n, "stopped/op")
	b.ReportMetric(float64(outOfTime)/n, "out-of-time/op")
	b.ReportMetric(median(lefts), "median-left/op")
	b.ReportMetric(float64(processes), "processes/op")
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// BenchmarkStopStormCgroup stops a storm whose supervisor is gone, with the
// launch's cgroup (ngsup run's default).
func BenchmarkStopStormCgroup(b *testing.B) { benchmarkStopStorm(b, false) }

// BenchmarkStopStormNoCgroup is the same with a launch started --no-cgroup.
func BenchmarkStopStormNoCgroup(b *testing.B) { benchmarkStopStorm(b, true) }

// cpuUse is what a process has used so far: clock ticks (utime+stime), CPU
// time from the scheduler and the context switches of all its threads
// (every wake-up is one).
type cpuUse struct {
	ticks   uint64
	cpuNS   uint64
	wakeups uint64
}

func readCPUUse(pid int) (cpuUse, error) {
	var u cpuUse
	st, err := ProcFS.ReadStat(pid)
	if err != nil {
		return u, err
	}
	u.ticks = st.UTime + st.STime
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return u, err
	}
	for _, t := range tasks {
		base := fmt.Sprintf("/proc/%d/task/%s/", pid, t.Name())
		if data, err := os.ReadFile(base + "schedstat"); err == nil {
			if f := strings.Fields(string(data)); len(f) > 0 {
				v, _ := strconv.ParseUint(f[0], 10, 64)
				u.cpuNS += v
			}
		}
		data, err := os.ReadFile(base + "status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				u.wakeups += n
			}
		}
	}
	return u, nil
}

// idleUse is what the process pid uses over d.
func idleUse(b testing.TB, pid int, d time.Duration) cpuUse {
	b.Helper()
	before, err := readCPUUse(pid)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(d)
	after, err := readCPUUse(pid)
	if err != nil {
		b.Fatal(err)
	}
	return cpuUse{after.ticks - before.ticks, after.cpuNS - before.cpuNS, after.wakeups - before.wakeups}
}

// BenchmarkSupervisorIdleFlat1000: the supervisor of the flat 1,000 tree,
// watched for idleWindow while the launch runs, then for idleWindow while a
// pause holds it (each a second after the verb, so the verb's own wake-up
// is not counted).
func BenchmarkSupervisorIdleFlat1000(b *testing.B) {
	skipUnlessRoot(b)
	bl := startBenchLaunch(b, treeFlat)
	var running, paused []float64
	for b.Loop() {
		time.Sleep(time.Second)
		run := idleUse(b, bl.sup.PID, idleWindow)
		pres, code, err := Pause(bl.dir, PauseOptions{})
		if err != nil || code != proto.ExitOK || !pres.Paused {
			b.Fatalf("pause: code %d, %v, %+v", code, err, pres)
		}
		time.Sleep(time.Second)
		held := idleUse(b, bl.sup.PID, idleWindow)
		if _, code, err := Continue(bl.dir); err != nil || code != proto.ExitOK {
			b.Fatalf("continue: code %d, %v", code, err)
		}
		for _, m := range []struct {
			name string
			u    cpuUse
		}{{"running", run}, {"paused", held}} {
			b.Logf("BENCHSAMPLE tree=%s method=idle-%s window_s=%g ticks=%d cpu_ms=%.3f wakeups=%d",
				treeFlat.name, m.name, idleWindow.Seconds(), m.u.ticks, float64(m.u.cpuNS)/1e6, m.u.wakeups)
		}
		running = append(running, float64(run.cpuNS)/1e6)
		paused = append(paused, float64(held.cpuNS)/1e6)
	}
	b.ReportMetric(median(running), "median-cpu-ms/running-10s")
	b.ReportMetric(median(paused), "median-cpu-ms/paused-10s")
}

// TestBenchStorm runs a small storm as the stop benchmarks do: its members
// do hop to new sessions and pids after the supervisor is killed, the stop
// ends them all, and the cage is gone afterwards.
func TestBenchStorm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, like the benchmarks")
	}
	tree := benchTree{name: "storm20", script: stormScript, arg: "20 1", processes: 39}
	s := startStorm(t, tree, false)
	sessions := func() map[int]bool {
		out := map[int]bool{}
		for _, pid := range s.cage.procs() {
			if st, err := ProcFS.ReadStat(pid); err == nil && st.Comm == "sh" {
				out[st.SID] = true
			}
		}
		return out
	}
	first := sessions()
	time.Sleep(2500 * time.Millisecond) // more than two hops
	later := sessions()
	for sid := range later {
		if first[sid] {
			t.Fatalf("session %d outlived two hops: the members do not hop (%d sessions before, %d after)", sid, len(first), len(later))
		}
	}
	if len(later) < 15 {
		t.Fatalf("%d member sessions after the supervisor was killed, want about 19", len(later))
	}
	res, code, err := stopStorm(s.launch.dir, "")
	if err != nil || code != proto.ExitOK || !res.Stopped {
		t.Fatalf("stop: code %d, %v, %+v", code, err, res)
	}
	if left := s.cage.procs(); len(left) != 0 {
		t.Fatalf("%d processes left in the cage after the stop: %v", len(left), left)
	}
	path := s.cage.path
	s.end(t)
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the cage %s is still there: %v", path, err)
	}
}

// TestBenchStormGuard: a benchmark process that dies without running its
// cleanups leaves no storm behind: the cage's guard sees the lifeline close,
// kills everything in the cage and removes it.
func TestBenchStormGuard(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, like the benchmarks")
	}
	if os.Getenv("NGSUP_REAPER_TEST_STORM_GUARD") != "" {
		// The child: a storm, its supervisor killed; say where; hang.
		s := startStorm(t, benchTree{name: "guard", script: stormScript, arg: "10 1", processes: 19}, false)
		fmt.Printf("CAGE %s\n", s.cage.path)
		select {}
	}
	var path string
	cmd := startSelf(t, "TestBenchStormGuard", "NGSUP_REAPER_TEST_STORM_GUARD", func(line string) bool {
		_, err := fmt.Sscanf(line, "CAGE %s", &path)
		return err == nil
	})
	if path == "" {
		t.Fatal("the child never reported its cage")
	}
	c := &cage{path: path}
	t.Cleanup(func() { emptyCage(path, 10*time.Second) }) // if the guard failed
	if n := len(c.procs()); n < 10 {
		t.Fatalf("%d processes in the cage before the kill, want about 19", n)
	}
	cmd.Process.Kill() // no cleanup runs in the child
	cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the benchmark process died, its cage %s holds %d processes", path, len(c.procs()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The child's temp folders (its cleanup never ran).
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), "TestBenchStormGuard*"))
	for _, m := range matches {
		os.RemoveAll(m)
	}
}
