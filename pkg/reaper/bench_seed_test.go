package reaper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ngharness/ngharness/pkg/proto"
)

// The comparison with the seed's method (issue 22, goal 1):
//
//	NGSUP_BENCH_BIN=bin/ngsup NGSUP_BENCH_OLD_BIN=/tmp/old/ngsup \
//	go test -run '^$' -bench SeedWalk -benchtime 7x -count 1 ./pkg/reaper/
//
// BenchmarkSeedWalkFlat{1000,4000,10000} build one flat tree of N sleeping
// processes under a supervised launch, in a cage (a cgroup2 cgroup of the
// benchmark's own, emptied by cgroup.kill whatever happens to the
// benchmark), and then, on that very tree, time in turn:
//
//   - "new": the CLI `ngsup pause --dir D` of the ngsup binary under test
//     (NGSUP_BENCH_BIN; built from this tree when unset), then its
//     `ngsup continue --dir D`;
//   - "old": the same with the binary NGSUP_BENCH_OLD_BIN (an older ngsup,
//     built from another commit; left out when unset);
//   - "seed": scripts/seedwalk.py, the yardstick: our Python rendering of
//     the seed's walk of /proc/<pid>/task/*/children from the supervisor,
//     SIGSTOP to each process found and a confirmation that each stopped,
//     then its SIGCONT of each.
//
// One iteration is one round: every method once, each started on a tree
// asleep again, the order rotated from round to round so that none always
// follows another. Each pause is logged as a BENCHSAMPLE line with its wall
// time (process start included), the time the program reports for itself
// (elapsed_ms: ngsup's verb, the interpreter's walk; neither counts starting
// the process), the processes it held and the load average; scripts/bench.sh
// prints the medians and the ratios.

const (
	// seedBinEnv names the ngsup binary timed as "new".
	seedBinEnv = "NGSUP_BENCH_BIN"
	// seedOldBinEnv names the older ngsup binary timed as "old".
	seedOldBinEnv = "NGSUP_BENCH_OLD_BIN"
	// seedPythonEnv names the Python interpreter that runs the yardstick
	// (python3 from PATH when unset).
	seedPythonEnv = "NGSUP_BENCH_PYTHON"
	// pidHeadroom is the room left for the rest of the machine, in pids,
	// beyond a benchmark tree.
	pidHeadroom = 2000
)

// seedTree is the flat tree of n sleeps: the harness and its n children.
func seedTree(n int) benchTree {
	return benchTree{name: "flat" + strconv.Itoa(n), script: flatScript, arg: strconv.Itoa(n), processes: n + 1}
}

// seedMethod is one way of pausing and continuing the tree.
type seedMethod struct {
	name string
	// pause and cont are the argv of the two commands; pause may name the
	// supervisor's pid as "{sup}".
	pause, cont []string
}

// seedSample is what one pause and its continue gave.
type seedSample struct {
	pauseMS, selfMS, contMS float64
	cpuMS                   float64 // the pause's CPU time, user and system
	processes, passes       int
}

// seedReply is the part of a pause's or continue's JSON line the benchmark
// reads (ngsup's and the yardstick's alike).
type seedReply struct {
	Paused    *bool   `json:"paused"`
	Processes int     `json:"processes"`
	Passes    int     `json:"passes"`
	ElapsedMS float64 `json:"elapsed_ms"`
}

// runTimed runs argv and returns its JSON reply and wall time.
func runTimed(argv []string) (seedReply, float64, error) {
	rep, wall, _, err := runTimedCPU(argv)
	return rep, wall, err
}

// runTimedCPU is runTimed that also returns the CPU time the command used
// (user and system, in ms).
func runTimedCPU(argv []string) (seedReply, float64, float64, error) {
	var out, errb bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	begin := time.Now()
	err := cmd.Run()
	wall := ms(time.Since(begin))
	var cpu float64
	if ps := cmd.ProcessState; ps != nil {
		cpu = ms(ps.UserTime() + ps.SystemTime())
	}
	var rep seedReply
	if err != nil {
		return rep, wall, cpu, fmt.Errorf("%s: %v: %s %s", strings.Join(argv, " "), err, strings.TrimSpace(out.String()), strings.TrimSpace(errb.String()))
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return rep, wall, cpu, fmt.Errorf("%s printed %q: %v", strings.Join(argv, " "), out.String(), err)
	}
	return rep, wall, cpu, nil
}

// run pauses and continues the tree once by m.
func (m seedMethod) run(sup int) (seedSample, error) {
	var s seedSample
	argv := make([]string, len(m.pause))
	for i, a := range m.pause {
		argv[i] = strings.ReplaceAll(a, "{sup}", strconv.Itoa(sup))
	}
	rep, wall, cpu, err := runTimedCPU(argv)
	if err == nil && rep.Paused != nil && !*rep.Paused {
		err = fmt.Errorf("%s: not paused: %+v", m.name, rep)
	}
	if err != nil {
		// A pause not confirmed in its budget (a heavily loaded machine)
		// is a result, not the end of the benchmark: continue what it
		// may hold (ngsup undid its own; the yardstick's continue
		// resumes what it recorded), and say so.
		runTimed(m.cont)
		return s, err
	}
	s.pauseMS, s.cpuMS, s.selfMS, s.processes, s.passes = wall, cpu, rep.ElapsedMS, rep.Processes, rep.Passes
	_, s.contMS, err = runTimed(m.cont)
	return s, err
}

// seedPython returns the interpreter that runs the yardstick, or skips.
func seedPython(b testing.TB) string {
	if p := os.Getenv(seedPythonEnv); p != "" {
		return p
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		b.Skipf("the seed's walk is timed in Python: no python3 on PATH (or set %s)", seedPythonEnv)
	}
	// A version manager's shim is a script; what it runs is what is timed
	// either way, but its start is not.
	if out, err := exec.Command(p, "-c", "import sys; print(sys.executable)").Output(); err == nil {
		if real := strings.TrimSpace(string(out)); real != "" {
			return real
		}
	}
	return p
}

// seedScript is the path of scripts/seedwalk.py.
func seedScript(b testing.TB) string {
	path, err := filepath.Abs(filepath.Join("..", "..", "scripts", "seedwalk.py"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		b.Fatalf("the yardstick: %v", err)
	}
	return path
}

// ngsupUnderTest is NGSUP_BENCH_BIN, or ngsup built from this tree as
// `make ngsup` builds it.
func ngsupUnderTest(b testing.TB) string {
	if p := os.Getenv(seedBinEnv); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			b.Fatal(err)
		}
		return abs
	}
	bin := filepath.Join(b.TempDir(), "ngsup")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "../../cmd/ngsup")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build ngsup (or set %s): %v\n%s", seedBinEnv, err, out)
	}
	return bin
}

// pidRoom checks that the machine has room for a tree of n processes: pids
// (kernel.pid_max) and threads (kernel.threads-max), beyond the threads that
// run now and pidHeadroom more. It returns what it read, for the log.
func pidRoom(b testing.TB, n int) string {
	read := func(path string) int {
		data, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			b.Fatalf("%s: %v", path, err)
		}
		return v
	}
	pidMax := read("/proc/sys/kernel/pid_max")
	threadsMax := read("/proc/sys/kernel/threads-max")
	// The fourth field of loadavg is runnable/total threads.
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		b.Fatal(err)
	}
	_, total, _ := strings.Cut(strings.Fields(string(data))[3], "/")
	threads, err := strconv.Atoi(total)
	if err != nil {
		b.Fatalf("/proc/loadavg: %q", data)
	}
	room := fmt.Sprintf("pid_max=%d threads_max=%d threads=%d", pidMax, threadsMax, threads)
	if need := threads + n + pidHeadroom; need > pidMax || need > threadsMax {
		b.Skipf("no room for %d more processes: %s (raise kernel.pid_max or kernel.threads-max)", n, room)
	}
	return room
}

func load1() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "-"
	}
	return strings.Fields(string(data))[0]
}

// seedMethods are the methods timed on the launch in dir: new, old (when
// NGSUP_BENCH_OLD_BIN is set) and seed.
func seedMethods(b testing.TB, dir string) []seedMethod {
	state := filepath.Join(b.TempDir(), "seedwalk.state")
	py, script := seedPython(b), seedScript(b)
	bins := []struct{ name, bin string }{{"new", ngsupUnderTest(b)}}
	if old := os.Getenv(seedOldBinEnv); old != "" {
		bins = append(bins, struct{ name, bin string }{"old", old})
	}
	var out []seedMethod
	for _, nb := range bins {
		out = append(out, seedMethod{name: nb.name,
			pause: []string{nb.bin, "pause", "--dir", dir},
			cont:  []string{nb.bin, "continue", "--dir", dir}})
	}
	return append(out, seedMethod{name: "seed",
		pause: []string{py, script, "pause", "{sup}", state},
		cont:  []string{py, script, "continue", state}})
}

// startCagedLaunch builds tree under a supervised launch in a cage of its
// own: the cage's guard empties it with cgroup.kill when the benchmark ends
// or dies, so no process of the tree outlives it.
func startCagedLaunch(b testing.TB, tree benchTree) *benchLaunch {
	b.Helper()
	c := newCage(b)
	bl := startSupervised(b, tree, launchOptions{
		cgroupFD: int(c.dir.Fd()),
		end: func(bl *benchLaunch, tb testing.TB) {
			bl.stop(tb)
			c.clear(tb)
		},
	})
	bl.waitBuilt(b, tree.processes, 10*time.Minute)
	return bl
}

func benchmarkSeedWalk(b *testing.B, n int) {
	skipUnlessRoot(b)
	tree := seedTree(n)
	room := pidRoom(b, tree.processes)
	bl := startCagedLaunch(b, tree)
	methods := seedMethods(b, bl.dir)
	b.Logf("tree %s: %d processes, %s, methods %d", tree.name, tree.processes, room, len(methods))
	var news []float64
	failed := map[string]int{}
	for round := 0; b.Loop(); round++ {
		for k := range methods {
			m := methods[(round+k)%len(methods)]
			// Each pause starts on a tree asleep again, and the next
			// method waits for it.
			bl.waitBuilt(b, tree.processes, time.Minute)
			load := load1()
			s, err := m.run(bl.sup.PID)
			if err == nil && s.processes != tree.processes {
				err = fmt.Errorf("held %d processes, want %d", s.processes, tree.processes)
			}
			if err != nil {
				// Printed and counted (scripts/bench.sh), not fatal: one
				// method's failure under load says nothing of the others.
				// A method that fails every time ends the benchmark.
				failed[m.name]++
				fmt.Printf("BENCHFAIL tree=%s method=seedwalk who=%s round=%d load1=%s error=%q\n", tree.name, m.name, round, load, err.Error())
				if failed[m.name] > round/2+2 {
					b.Fatalf("round %d, %s failed %d times; last: %v", round, m.name, failed[m.name], err)
				}
				continue
			}
			if m.name == "new" {
				news = append(news, s.pauseMS)
			}
			// Printed, not logged: a benchmark's log keeps only its
			// first lines.
			fmt.Printf("BENCHSAMPLE tree=%s method=seedwalk who=%s round=%d pause_ms=%.3f self_ms=%.3f cpu_ms=%.3f continue_ms=%.3f processes=%d passes=%d load1=%s\n",
				tree.name, m.name, round, s.pauseMS, s.selfMS, s.cpuMS, s.contMS, s.processes, s.passes, load)
		}
	}
	b.ReportMetric(median(news), "median-ms/pause")
	b.ReportMetric(float64(tree.processes), "processes/op")
}

// BenchmarkSeedWalkFlat1000 compares ngsup's pause with the seed's walk on a
// flat tree of 1,000 sleeps (1,001 processes with the harness).
func BenchmarkSeedWalkFlat1000(b *testing.B) { benchmarkSeedWalk(b, 1000) }

// BenchmarkSeedWalkFlat4000 is the same at 4,000 sleeps.
func BenchmarkSeedWalkFlat4000(b *testing.B) { benchmarkSeedWalk(b, 4000) }

// BenchmarkSeedWalkFlat10000 is the same at 10,000 sleeps: it needs pid and
// thread room for them (pidRoom says what it found, and skips without).
func BenchmarkSeedWalkFlat10000(b *testing.B) { benchmarkSeedWalk(b, 10000) }

// TestSeedWalkScript proves the yardstick does what the benchmark times: on
// a small flat tree under a real launch, its pause leaves every process of
// the tree stopped (T) and says how many it held, and its continue leaves
// every one running again.
func TestSeedWalkScript(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, like the benchmarks")
	}
	tree := seedTree(20)
	bl := startBenchLaunch(t, tree)
	py, script := seedPython(t), seedScript(t)
	state := filepath.Join(t.TempDir(), "state")
	// A stopped tree: the walk of count sees no sleeper.
	stopped := func() (n, inT int) {
		queue, kids := []int{bl.sup.PID}, []int(nil)
		for len(queue) > 0 {
			pid := queue[0]
			queue = queue[1:]
			st, err := ProcFS.ReadStat(pid)
			if err != nil {
				continue
			}
			if pid != bl.sup.PID {
				n++
				if st.State == 'T' {
					inT++
				}
			}
			kids, _ = ProcFS.Children(pid, st.NumThreads, kids[:0])
			queue = append(queue, kids...)
		}
		return n, inT
	}
	rep, _, err := runTimed([]string{py, script, "pause", strconv.Itoa(bl.sup.PID), state})
	if err != nil {
		t.Fatal(err)
	}
	// Continue whatever happens, so the launch's stop finds it running.
	t.Cleanup(func() { runTimed([]string{py, script, "continue", state}) })
	if n, inT := stopped(); rep.Processes != tree.processes || n != tree.processes || inT != n {
		t.Fatalf("after the yardstick's pause (it held %d): %d processes, %d in T; want %d, all in T", rep.Processes, n, inT, tree.processes)
	}
	if rep, _, err = runTimed([]string{py, script, "continue", state}); err != nil || rep.Processes != tree.processes {
		t.Fatalf("the yardstick's continue: %+v, %v", rep, err)
	}
	bl.waitBuilt(t, tree.processes, time.Minute)
	if r, err := proto.ReadReceipt(bl.dir); err != nil || r.Ended {
		t.Fatalf("the launch ended: %+v, %v", r, err)
	}
	if _, err := exec.Command(py, script, "bogus").Output(); !errors.As(err, new(*exec.ExitError)) {
		t.Errorf("the yardstick took a bad verb: %v", err)
	}
}
