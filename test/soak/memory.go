package main

// -backend memory: the driver's own cost, and how it grows. The same
// rollouts and checkpoints as the soak's (Gym's wire: runs posted with
// _ng_rollout_id, each checkpoint prepare, commit and resume of the driver
// and then of the owner), with sandboxes whose exec answers from memory
// (internal/memsandbox): no process runs, so what the driver process
// spends is the driver's own work. The driver runs as a child process of
// the soak (memdriver.go); the owner (pkg/driver/owner/lending over its own
// memory sandboxes, the Gym checkpoint participant, over HTTP on loopback)
// runs in the soak's process, so neither the owner nor the rollouts' clients
// are counted in the driver's figures. There is no crash: a memory sandbox
// lives in one process.
//
// It prints, for the size given (-rollouts): how long the runs took to be
// all launched, the driver's memory idle and with every run launched (live
// heap after a GC, RSS), its CPU while the runs wait (no checkpoint), and
// per checkpoint: prepare, the driver's commit, the owner's commit, and the
// driver's CPU over the checkpoint (from the prepare until every launch
// runs again), per rollout.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/internal/memsandbox"
	"github.com/ngharness/ngharness/pkg/driver/launch"
	"github.com/ngharness/ngharness/pkg/driver/owner"
	"github.com/ngharness/ngharness/pkg/driver/owner/httpowner"
	"github.com/ngharness/ngharness/pkg/driver/owner/lending"
	"github.com/ngharness/ngharness/pkg/driver/sandbox"
	"github.com/ngharness/ngharness/pkg/driver/serve"
	"github.com/ngharness/ngharness/pkg/gym"
)

// memDriverRole is the first argument that makes the soak's binary the
// memory backend's driver.
const memDriverRole = "memdriver"

// rampWave is how many rollouts the memory soak posts at once (-ramp).
var rampWave int

// backendFlag selects the soak: local (the default: real processes in
// local sandboxes, the crash), memory or opensandbox.
var backendFlag string

func init() {
	flag.IntVar(&rampWave, "ramp", 1000, "-backend memory: rollouts posted at once, each wave launched before the next")
	flag.StringVar(&backendFlag, "backend", "local", "local (real processes, a crash and restore), memory (the driver's own cost: exec answered from memory) or opensandbox (the fake OpenSandbox of internal/fake/execd at the real server's timing)")
}

// runBackend runs the soak of a backend other than local.
func runBackend(c config) error {
	switch backendFlag {
	case "memory":
		return runMemory(c)
	case "opensandbox":
		return runOpenSandbox(c)
	}
	return fmt.Errorf("-backend %q: want local, memory or opensandbox", backendFlag)
}

// raiseFileLimit raises the soft limit of open files to the hard one (to
// its ceiling, as root): each rollout holds a connection at each end, and
// the driver one to the owner. It returns the limit now.
func raiseFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	if os.Geteuid() == 0 {
		if data, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); err == nil && n > r.Max {
				r.Max = n
			}
		}
	}
	r.Cur = r.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r)
	}
	return r.Cur
}

// vmRSS is a process's resident memory now, in bytes.
func vmRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			if f := strings.Fields(l); len(f) >= 2 {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// loadAvg is the first field of /proc/loadavg.
func loadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// postRuns posts rollouts from to to (attempt 0) to the driver and
// records how they end in results; a run posted while a checkpoint holds
// admission closed is posted again, as Gym's collector does. body makes
// rollout i's body. ended counts the runs whose request came back.
func postRuns(ctl *controller, url string, from, to int, body func(i int) map[string]any, results []result, wg *sync.WaitGroup, ended *atomic.Int64) {
	for i := from; i < to; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer ended.Add(1)
			b := body(i)
			id := b["_ng_rollout_id"].(string)
			b["_ng_attempt_index"] = 0
			results[i].attempts = 1
			for parked := 0; ; parked++ {
				out, code, err := ctl.post(fmt.Sprintf("%s/ng-rollout/%s/run", url, captureKey(id, 0)), b, false)
				if err != nil {
					results[i].err = err.Error()
					return
				}
				if code == http.StatusConflict && strings.Contains(string(out), `"checkpoint_parked"`) && parked < 100 {
					time.Sleep(200 * time.Millisecond)
					continue
				}
				if code != 200 {
					results[i].err = fmt.Sprintf("answered %d: %.300s", code, out)
					if code >= 500 {
						results[i].failed = append(results[i].failed, results[i].err)
					}
					return
				}
				var r struct {
					Reward float64 `json:"reward"`
				}
				json.Unmarshal(out, &r)
				results[i].ok = r.Reward == 1
				if !results[i].ok {
					results[i].err = fmt.Sprintf("reward %v: %.300s", r.Reward, out)
				}
				return
			}
		}(i)
	}
}

// checkpointFigures is one checkpoint as the soak timed it.
type checkpointFigures struct {
	prepare, commit, ownerCommit, window float64 // seconds
	cpu                                  float64 // the driver's CPU seconds over the window
}

// checkpoint runs one checkpoint of the driver and the owner as Gym's
// coordinator does and times it.
func checkpoint(ctl *controller, driverURL, ownerURL, id, dir string) (checkpointFigures, error) {
	var f checkpointFigures
	t0 := time.Now()
	var prep, oprep prepareReply
	if err := ctl.call(driverURL, "prepare", map[string]any{"checkpoint_id": id}, &prep); err != nil {
		return f, err
	}
	f.prepare = time.Since(t0).Seconds()
	if prep.Phase != "prepared" {
		ctl.call(driverURL, "resume", map[string]any{"checkpoint_id": id}, nil)
		return f, fmt.Errorf("%s: the driver answered phase %s, %d blockers: %v", id, prep.Phase, prep.Report.BlockerCount, prep.Report.Blockers[:min(5, len(prep.Report.Blockers))])
	}
	if err := ctl.call(ownerURL, "prepare", map[string]any{"checkpoint_id": id}, &oprep); err != nil {
		return f, fmt.Errorf("owner %w", err)
	}
	if oprep.Phase != "prepared" {
		ctl.resumeAll(ownerURL, driverURL, id)
		return f, fmt.Errorf("%s: the owner answered phase %s", id, oprep.Phase)
	}
	var com, ocom commitReply
	// A commit's deadline is the coordinator's; the owner's snapshots of
	// a remote backend take minutes at thousands of sessions.
	deadline := float64(time.Now().Add(30*time.Minute).UnixNano()) / 1e9
	t1 := time.Now()
	if err := ctl.call(driverURL, "commit", map[string]any{"checkpoint_id": id, "checkpoint_dir": dir, "deadline_ts": deadline}, &com); err != nil {
		return f, err
	}
	f.commit = time.Since(t1).Seconds()
	t2 := time.Now()
	if err := ctl.call(ownerURL, "commit", map[string]any{"checkpoint_id": id, "checkpoint_dir": dir, "deadline_ts": deadline}, &ocom); err != nil {
		return f, fmt.Errorf("owner %w", err)
	}
	f.ownerCommit = time.Since(t2).Seconds()
	if com.Phase != "committed" || ocom.Phase != "committed" {
		return f, fmt.Errorf("commit %s: the driver answered %s, the owner %s", id, com.Phase, ocom.Phase)
	}
	return f, ctl.resumeAll(ownerURL, driverURL, id)
}

func runMemory(c config) error {
	crashSet := false
	flag.Visit(func(f *flag.Flag) { crashSet = crashSet || f.Name == "crash-at" })
	if crashSet && c.crashAt != 0 {
		return errors.New("-backend memory takes no -crash-at: a memory sandbox lives in one process, so nothing survives a crash of the driver")
	}
	nofile := raiseFileLimit()
	bin, _ := filepath.Abs(c.bin)
	if err := c.defaults("ngsoak-mem-"); err != nil {
		return err
	}
	token := "soak-" + strconv.Itoa(os.Getpid())
	discard := slog.New(slog.DiscardHandler)

	// The owner, in this process, over sandboxes of its own in memory.
	ng := &launch.Ngsup{Binaries: launch.DefaultBinaries(bin), Log: discard}
	if len(ng.Binaries) == 0 {
		return fmt.Errorf("no ngsup binary in %s (make build)", bin)
	}
	own := lending.New(lending.Options{Sandboxes: memsandbox.New(memsandbox.Options{}), RemoveUnused: true, Logger: discard,
		StopSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return ng.StopSandbox(ctx, sb) },
		KillSandbox: func(ctx context.Context, sb sandbox.Sandbox) error { return ng.StopSandboxGrace(ctx, sb, 0) }})
	control, err := owner.NewControl(own, gym.Config{Instance: "ngdriver_owner", LeaseGrace: 600 * time.Second})
	if err != nil {
		return err
	}
	osrv := &httpowner.Server{Owner: own, Control: control, Token: token, Log: discard, Metrics: serve.NewRegistry(), ClientError: lending.ClientError}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ohs := &http.Server{Handler: osrv.Handler(), ReadHeaderTimeout: 30 * time.Second}
	go ohs.Serve(ln)
	defer ohs.Close()
	ownerURL := "http://" + ln.Addr().String()

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	d, err := start(exe, filepath.Join(c.work, "driver.log"), []string{"NG_CONTROL_TOKEN=" + token},
		memDriverRole, "-owner", ownerURL, "-max-runs", strconv.Itoa(c.maxRuns), "-ngsup-dir", bin)
	if err != nil {
		return err
	}
	defer d.kill()
	pid := d.cmd.Process.Pid
	fmt.Fprintf(os.Stderr, "soak: the driver (pid %d) serves at %s (pprof under /debug/pprof/, its figures at /debug/stats)\n", pid, d.url)
	stats := func(gc bool) (debugStats, error) {
		u := d.url + "/debug/stats"
		if gc {
			u += "?gc=1"
		}
		var st debugStats
		resp, err := http.Get(u)
		if err != nil {
			return st, err
		}
		defer resp.Body.Close()
		return st, json.NewDecoder(resp.Body).Decode(&st)
	}
	ctl := &controller{token: token, client: &http.Client{Timeout: 0}}
	// Runs long enough to outlast any ramp and every checkpoint; once
	// measured, the soak makes them finish (POST /debug/finish).
	steps := int(24 * time.Hour.Seconds() / c.stepS)
	fmt.Fprintf(os.Stderr, "soak: memory backend: %d rollouts of %d steps of %.1fs, a checkpoint every %s for %s; open files %d; load %s; work in %s\n",
		c.rollouts, steps, c.stepS, c.every, c.duration, nofile, loadAvg(), c.work)

	time.Sleep(time.Second)
	idle, err := stats(true)
	if err != nil {
		return fmt.Errorf("the driver's stats: %w", err)
	}
	idleRSS := vmRSS(pid)

	var finished atomic.Int64
	begin := time.Now()
	results := make([]result, c.rollouts)
	var wg sync.WaitGroup
	body := func(i int) map[string]any {
		id := fmt.Sprintf("soak-%05d", i)
		return map[string]any{"_ng_rollout_id": id, "task": "soak " + id, "check": "true",
			"fake": map[string]any{"steps": steps, "step_s": c.stepS}}
	}
	// Posted in waves of -ramp, each launched before the next is posted:
	// a wave's calls to the owner each hold a connection at both ends,
	// and the soak cannot raise the open-file limit past its hard one.
	var st debugStats
	for from := 0; from < c.rollouts; from += rampWave {
		to := min(from+rampWave, c.rollouts)
		postRuns(ctl, d.url, from, to, body, results, &wg, &finished)
		for {
			if st, err = stats(false); err != nil {
				return err
			}
			if st.Memory.Running+st.Memory.Paused >= to {
				break
			}
			if time.Since(begin) > 20*time.Minute || finished.Load() > 0 {
				return fmt.Errorf("after %s, %d of %d launches run (%d runs finished): see %s", time.Since(begin).Round(time.Second), st.Memory.Running, to, finished.Load(), d.logf.Name())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	ramp := time.Since(begin)
	cpuRamp := st.CPUS - idle.CPUS
	time.Sleep(2 * time.Second)
	full, _ := stats(true)
	fullRSS := vmRSS(pid)
	// The runs waiting, no checkpoint.
	w0 := time.Now()
	s0, _ := stats(false)
	time.Sleep(c.every)
	s1, _ := stats(false)
	waitRate := (s1.CPUS - s0.CPUS) / time.Since(w0).Seconds()
	fmt.Fprintf(os.Stderr, "soak: %d launched in %.1fs; live heap %.1f MB (idle %.1f MB), RSS %.0f MB; waiting: %.3f CPU s/s\n",
		c.rollouts, ramp.Seconds(), float64(full.HeapAlloc)/1e6, float64(idle.HeapAlloc)/1e6, fullRSS/1e6, waitRate)

	var cks []checkpointFigures
	var heapAfter []float64
	ckBegin := time.Now()
	for n := 1; time.Since(ckBegin) < c.duration; n++ {
		id := fmt.Sprintf("ckpt-%03d", n)
		a, _ := stats(false)
		t := time.Now()
		f, err := checkpoint(ctl, d.url, ownerURL, id, filepath.Join(c.work, "checkpoints", id))
		if err != nil {
			return err
		}
		// The window ends once every launch runs again (the resume's
		// continues go out after its answer).
		for {
			if st, err = stats(false); err != nil {
				return err
			}
			if st.Memory.Paused == 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		f.window = time.Since(t).Seconds()
		f.cpu = st.CPUS - a.CPUS
		cks = append(cks, f)
		h, _ := stats(true)
		heapAfter = append(heapAfter, float64(h.HeapAlloc))
		fmt.Fprintf(os.Stderr, "soak: %s: prepare %.3fs, commit %.3fs, owner commit %.3fs, driver CPU %.2fs over %.2fs (%.3f ms a rollout), %d runs, load %s\n",
			id, f.prepare, f.commit, f.ownerCommit, f.cpu, f.window, 1000*f.cpu/float64(c.rollouts), st.Memory.Running, loadAvg())
		os.RemoveAll(filepath.Join(c.work, "checkpoints", fmt.Sprintf("ckpt-%03d", n-3)))
		time.Sleep(time.Until(t.Add(c.every)))
	}
	peak, _ := usage(pid)
	if resp, err := http.Post(d.url+"/debug/finish", "", nil); err == nil {
		resp.Body.Close()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		fmt.Fprintln(os.Stderr, "soak: runs still in flight at the deadline")
	}
	end, _ := stats(false)
	wall := time.Since(begin)
	os.RemoveAll(filepath.Join(c.work, "checkpoints"))

	lost, failed := 0, 0
	var errs []string
	for i, r := range results {
		if !r.ok {
			lost++
			if len(errs) < 5 {
				errs = append(errs, fmt.Sprintf("soak-%05d: %s", i, r.err))
			}
		}
		if len(r.failed) > 0 {
			failed++
		}
	}
	col := func(get func(checkpointFigures) float64) []float64 {
		out := make([]float64, len(cks))
		for i, f := range cks {
			out[i] = get(f)
		}
		return out
	}
	n := float64(c.rollouts)
	cpuPer := col(func(f checkpointFigures) float64 { return 1000 * f.cpu / n })
	netPer := col(func(f checkpointFigures) float64 { return 1000 * (f.cpu - waitRate*f.window) / n })
	fmt.Printf("\n## Soak, memory backend: %d rollouts, %d checkpoints every %s (load average %s at the end)\n\n", c.rollouts, len(cks), c.every, loadAvg())
	fmt.Printf("| figure | value |\n|---|---|\n")
	fmt.Printf("| all launched after | %.1f s (driver CPU %.1f s: %.2f ms a rollout) |\n", ramp.Seconds(), cpuRamp, 1000*cpuRamp/n)
	fmt.Printf("| driver live heap, idle / all running | %.1f MB / %.1f MB: **%.1f KB a rollout** |\n", float64(idle.HeapAlloc)/1e6, float64(full.HeapAlloc)/1e6, (float64(full.HeapAlloc)-float64(idle.HeapAlloc))/n/1e3)
	fmt.Printf("| driver heap in use (runtime), all running | %.1f MB (stacks %.1f MB, %d goroutines) |\n", float64(full.HeapInuse)/1e6, float64(full.StackInuse)/1e6, full.Goroutines)
	fmt.Printf("| driver RSS, idle / all running | %.1f MB / %.1f MB: **%.1f KB a rollout** |\n", idleRSS/1e6, fullRSS/1e6, (fullRSS-idleRSS)/n/1e3)
	fmt.Printf("| driver live heap after each checkpoint, median | %.1f MB |\n", median(heapAfter)/1e6)
	fmt.Printf("| driver peak RSS (VmHWM) | %.0f MB |\n", peak)
	fmt.Printf("| driver CPU while the runs wait | %.3f CPU s/s (%.1f µs a rollout a second) |\n", waitRate, 1e6*waitRate/n)
	fmt.Printf("| prepare, median (max) | %.3f s (%.3f s) |\n", median(col(func(f checkpointFigures) float64 { return f.prepare })), slices.Max(append(col(func(f checkpointFigures) float64 { return f.prepare }), 0)))
	fmt.Printf("| driver commit, median | %.3f s |\n", median(col(func(f checkpointFigures) float64 { return f.commit })))
	fmt.Printf("| owner commit (in the soak's process), median | %.3f s |\n", median(col(func(f checkpointFigures) float64 { return f.ownerCommit })))
	fmt.Printf("| checkpoint window (prepare to every launch running), median | %.3f s |\n", median(col(func(f checkpointFigures) float64 { return f.window })))
	fmt.Printf("| driver CPU a checkpoint, median | %.2f s: **%.3f ms a rollout** (%.3f ms less the waiting rate) |\n", median(col(func(f checkpointFigures) float64 { return f.cpu })), median(cpuPer), median(netPer))
	fmt.Printf("| per checkpoint, ms a rollout | %s |\n", fmtList(cpuPer))
	fmt.Printf("| driver CPU, whole run | %.1f s over %.0f s |\n", end.CPUS-idle.CPUS, wall.Seconds())
	fmt.Printf("| runs lost / failed by the driver | %d / %d |\n", lost, failed)
	fmt.Printf("| memory sandbox execs | %s |\n", fmtCounts(end.Memory.Execs))
	fmt.Printf("| commands the memory sandbox did not understand | %d %s |\n", end.Memory.Unknown, end.Memory.LastUnknown)
	for _, e := range errs {
		fmt.Printf("\nlost: %s\n", e)
	}
	if resp, err := http.Get(d.url + "/metrics"); err == nil {
		m, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for k, v := range metric(m, "ngdriver_failed_pauses_total") {
			fmt.Printf("\nfailed pauses %s: %.0f\n", k, v)
		}
	}
	return nil
}

func fmtList(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 3, 64)
	}
	return strings.Join(parts, ", ")
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
