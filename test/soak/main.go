// Command soak is the scale benchmark of `ngdriver serve`: many concurrent
// rollouts of the fake adapter in local sandboxes, a checkpoint every few
// seconds, one crash (SIGKILL of the driver) and restore in the middle. It
// drives a real `ngdriver owner serve` and a real `ngdriver serve` over HTTP
// on loopback, as the rollout framework would, and prints a table: prepare
// time (median, max), pauses, failed pauses and their causes, relaunches,
// runs lost, runs that repeated a step, the driver's peak memory and CPU.
// Both are driven on NeMo Gym's wire as Gym's coordinator and collector
// drive an agent and a resources server: runs name themselves with
// _ng_rollout_id and are posted to /ng-rollout/<capture key>/run; each
// checkpoint is prepare (the driver, then the owner), commit of both into
// one checkpoint_dir (gym/agent/soak and gym/resources/ngdriver_owner:
// the owner snapshots each open session's sandbox) and resume of both;
// after the crash the new driver and the owner restore under one
// checkpoint id from the last commit's folder, scoped to the episodes it
// wrote (the owner forks each snapshot for the next attempt), and are
// resumed before the runs are posted again as their next attempt. As a
// controller that keeps its last three checkpoints, the soak deletes the
// folders of older ones; the owner removes the snapshots no remaining
// folder names at its next commit, so a run's disk use stays at about four
// checkpoints' worth (512 sandboxes: a few GB each).
//
// Run it with `make soak` (root). It kills only the processes it started,
// by their process groups, and stops every launch it made through ngsup.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ngharness/ngharness/internal/proctest"
	"github.com/ngharness/ngharness/pkg/driver/fake"
)

type config struct {
	bin       string
	work      string
	rollouts  int
	duration  time.Duration
	every     time.Duration
	crashAt   time.Duration
	stepS     float64
	isolation string
	maxRuns   int
	keep      bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == memDriverRole {
		if err := serveMemDriver(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "soak %s: %v\n", memDriverRole, err)
			os.Exit(1)
		}
		return
	}
	var c config
	flag.StringVar(&c.bin, "bin", "bin", "folder with ngdriver and ngsup-linux-*")
	flag.StringVar(&c.work, "work", "", "work folder (default: a new temp folder)")
	flag.BoolVar(&c.keep, "keep", false, "keep the sandboxes and snapshots afterwards (gigabytes at 512 rollouts); logs are always kept")
	flag.IntVar(&c.rollouts, "rollouts", 512, "concurrent rollouts")
	flag.DurationVar(&c.duration, "duration", 2*time.Minute, "how long checkpoints are taken")
	flag.DurationVar(&c.every, "every", 10*time.Second, "time between checkpoints")
	flag.DurationVar(&c.crashAt, "crash-at", time.Minute, "crash the driver after the first checkpoint committed at or after this time (0: no crash)")
	flag.Float64Var(&c.stepS, "step", 1, "seconds per fake step")
	flag.StringVar(&c.isolation, "isolation", "auto", "local sandboxes: auto (a mount namespace per sandbox when root), namespace or none")
	flag.IntVar(&c.maxRuns, "max-runs", 0, "the driver's max_runs (0: the number of rollouts)")
	flag.Parse()
	run := run
	if backendFlag != "local" {
		run = runBackend
	}
	if err := run(c); err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
}

// proc is a server the soak started, in its own process group.
type proc struct {
	cmd  *exec.Cmd
	url  string
	logf *os.File
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

func start(name string, logPath string, env []string, args ...string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, logf: logf}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case line <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case p.url = <-line:
		return p, nil
	case <-time.After(30 * time.Second):
		p.kill()
		return nil, fmt.Errorf("%s did not start; see %s", name, logPath)
	}
}

// kill ends the server's whole process group and reaps it.
func (p *proc) kill() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
	p.logf.Close()
}

// usage samples a process's peak RSS (VmHWM) and CPU seconds.
func usage(pid int) (peakMB float64, cpuS float64) {
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "VmHWM:") {
				f := strings.Fields(l)
				if len(f) >= 2 {
					kb, _ := strconv.ParseFloat(f[1], 64)
					peakMB = kb / 1024
				}
			}
		}
	}
	if st, ok := proctest.ReadStat(pid); ok {
		cpuS = float64(st.CPU()) / 100
	}
	return
}

type controller struct {
	token  string
	client *http.Client
}

func (c *controller) post(url string, body any, auth bool) ([]byte, int, error) {
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	if auth {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return out, resp.StatusCode, err
}

// call posts a control call and decodes its 200 reply into out (may be
// nil); the body gets a deadline_ts a minute away unless it has one.
func (c *controller) call(base, phase string, body map[string]any, out any) error {
	if _, ok := body["deadline_ts"]; !ok {
		body["deadline_ts"] = float64(time.Now().Add(time.Minute).UnixNano()) / 1e9
	}
	data, code, err := c.post(base+"/ng-control/v1/checkpoint/"+phase, body, true)
	if err != nil {
		return fmt.Errorf("%s: %w", phase, err)
	}
	if code != 200 {
		return fmt.Errorf("%s answered %d: %s", phase, code, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s: %w: %s", phase, err, data)
		}
	}
	return nil
}

// resumeAll resumes checkpoint id on the owner, then on the driver (so
// the calls of the runs the driver lets go find the owner's admission
// open); each must answer phase idle.
func (c *controller) resumeAll(ownerURL, driverURL, id string) error {
	for _, p := range []struct{ name, url string }{{"owner", ownerURL}, {"driver", driverURL}} {
		var r struct {
			Phase string `json:"phase"`
		}
		if err := c.call(p.url, "resume", map[string]any{"checkpoint_id": id}, &r); err != nil {
			return fmt.Errorf("%s %w", p.name, err)
		}
		if r.Phase != "idle" {
			return fmt.Errorf("%s resume %s answered phase %q", p.name, id, r.Phase)
		}
	}
	return nil
}

// The replies of the control planes the soak reads (Gym's).
type prepareReply struct {
	Phase  string `json:"phase"`
	Report struct {
		Ready        bool     `json:"ready"`
		Blockers     []string `json:"blockers"`
		BlockerCount int      `json:"blocker_count"`
		Restarts     []string `json:"restarts"`
	} `json:"report"`
}

type commitReply struct {
	Phase    string `json:"phase"`
	Manifest struct {
		RecordCount int `json:"record_count"`
	} `json:"manifest"`
	EpisodeIDs []string `json:"episode_ids"`
}

type restoreReply struct {
	Phase              string   `json:"phase"`
	SourceCheckpointID string   `json:"source_checkpoint_id"`
	Restored           []string `json:"restored"`
}

// episodeID is Gym's {rollout_id, attempt}.
type episodeID struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
}

// attemptSuffix is the -a<N> a capture key ends with after attempt 0.
var attemptSuffix = regexp.MustCompile(`-a([1-9][0-9]*)$`)

// parseKey inverts a capture key: <rollout> is attempt 0, <rollout>-a<N>
// attempt N.
func parseKey(key string) episodeID {
	if m := attemptSuffix.FindStringSubmatchIndex(key); m != nil {
		n, _ := strconv.Atoi(key[m[2]:m[3]])
		return episodeID{RolloutID: key[:m[0]], Attempt: n}
	}
	return episodeID{RolloutID: key}
}

// captureKey is the path segment of attempt n of rollout id.
func captureKey(id string, n int) string {
	if n == 0 {
		return id
	}
	return fmt.Sprintf("%s-a%d", id, n)
}

// result is what one rollout came to.
type result struct {
	ok       bool
	err      string
	launches []struct {
		Resumed bool   `json:"resumed"`
		Outcome string `json:"outcome"`
		Pauses  int    `json:"pauses"`
		Reason  string `json:"reason"`
	}
	attempts int
	// failed holds the errors of attempts the driver answered with a
	// failure (not the connection the crash broke): each such rollout
	// started over from its input on its next attempt.
	failed []string
}

// defaults fills what a mode's run needs and the flags left unset: a new
// work folder (named with prefix) and max_runs at the number of rollouts.
func (c *config) defaults(prefix string) error {
	if c.work == "" {
		d, err := os.MkdirTemp("", prefix)
		if err != nil {
			return err
		}
		c.work = d
	}
	if c.maxRuns == 0 {
		c.maxRuns = c.rollouts
	}
	return nil
}

func run(c config) error {
	if os.Geteuid() != 0 {
		return errors.New("run as root (local sandboxes, cgroups)")
	}
	bin, _ := filepath.Abs(c.bin)
	if err := c.defaults("ngsoak-"); err != nil {
		return err
	}
	base := filepath.Join(c.work, "local")
	if !c.keep {
		// Every sandbox and snapshot holds a copy of ngsup: at 512 rollouts
		// they fill gigabytes. The logs and records stay for reading.
		defer func() {
			os.RemoveAll(base)
			fmt.Fprintf(os.Stderr, "soak: logs in %s\n", c.work)
		}()
	}
	token := "soak-" + strconv.Itoa(os.Getpid())
	env := []string{"NG_CONTROL_TOKEN=" + token}
	owner, err := start(filepath.Join(bin, "ngdriver"), filepath.Join(c.work, "owner.log"), env,
		// The report reads the sessions in the sandboxes after the runs: keep them.
		"owner", "serve", "--listen", "127.0.0.1:0", "--base", base, "--ngsup-dir", bin, "--isolation", c.isolation, "--log-format", "json", "--keep-sandboxes")
	if err != nil {
		return err
	}
	defer owner.kill()
	cfgPath := filepath.Join(c.work, "ngdriver.yaml")
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
name: soak
token_env: NG_CONTROL_TOKEN
max_runs: %d
adapter: fake
stop_grace: 2s
ngsup_dir: %s
log_format: json
owner:
  url: %s
  retries: 5
backends:
  local:
    base: %s
    isolation: %s
`, c.maxRuns, bin, owner.url, base, c.isolation)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	driverLog := func(n int) string { return filepath.Join(c.work, fmt.Sprintf("driver-%d.log", n)) }
	driverN := 1
	startDriver := func(n int) (*proc, error) {
		return start(filepath.Join(bin, "ngdriver"), driverLog(n), env, "serve", "--config", cfgPath)
	}
	driver, err := startDriver(1)
	if err != nil {
		return err
	}
	var driverMu sync.Mutex
	currentDriver := func() *proc { driverMu.Lock(); defer driverMu.Unlock(); return driver }
	defer func() { currentDriver().kill() }()
	defer stopLaunches(bin, base)

	ctl := &controller{token: token, client: &http.Client{Timeout: 0}}
	steps := int((c.duration.Seconds() + 30) / c.stepS)
	fmt.Fprintf(os.Stderr, "soak: %d rollouts of %d steps of %.1fs, a checkpoint every %s for %s, crash at %s; work in %s\n",
		c.rollouts, steps, c.stepS, c.every, c.duration, c.crashAt, c.work)

	// Runs: each re-issued as its next attempt after the crash (its request
	// fails when the driver dies), as Gym re-issues a rollout.
	restored := make(chan struct{})
	results := make([]result, c.rollouts)
	var wg sync.WaitGroup
	begin := time.Now()
	var finished atomic.Int64
	for i := 0; i < c.rollouts; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("soak-%04d", i)
			body := map[string]any{"_ng_rollout_id": id, "task": "soak " + id,
				"check": fmt.Sprintf(`test "$(grep -c '^step' progress)" -ge %d`, steps),
				"fake":  map[string]any{"steps": steps, "step_s": c.stepS},
			}
			parked := 0
			for attempt := 0; attempt < 3; attempt++ {
				results[i].attempts = attempt + 1
				body["_ng_attempt_index"] = attempt
				out, code, err := ctl.post(fmt.Sprintf("%s/ng-rollout/%s/run", currentDriver().url, captureKey(id, attempt)), body, false)
				if err == nil && code >= 500 && code != 503 {
					results[i].failed = append(results[i].failed, fmt.Sprintf("attempt %d answered %d: %.400s", attempt, code, out))
				}
				if err != nil || code >= 500 && code != 503 || code == 499 {
					// The driver died under us (or failed the run): wait
					// for the restore, then post the next attempt.
					<-restored
					continue
				}
				if code == http.StatusConflict && bytes.Contains(out, []byte(`"checkpoint_parked"`)) && parked < 100 {
					// Posted while a checkpoint holds admission closed:
					// Gym's collector posts it again once it reopens.
					parked++
					attempt--
					time.Sleep(200 * time.Millisecond)
					continue
				}
				if code != 200 {
					results[i].err = fmt.Sprintf("answered %d: %.300s", code, out)
					return
				}
				var r struct {
					Reward   float64 `json:"reward"`
					Launches json.RawMessage
				}
				var m map[string]json.RawMessage
				json.Unmarshal(out, &m)
				json.Unmarshal(out, &r)
				json.Unmarshal(m["ng_harness_launches"], &results[i].launches)
				results[i].ok = r.Reward == 1
				if !results[i].ok {
					results[i].err = fmt.Sprintf("reward %v: %.300s", r.Reward, out)
				}
				finished.Add(1)
				return
			}
			results[i].err = "no attempt succeeded"
		}(i)
	}

	// Checkpoints.
	var prepares []float64
	var breakdowns []breakdown
	var notParked []string
	crashed := c.crashAt == 0
	ckptDir := filepath.Join(c.work, "checkpoints")
	var driverCPU, driverPeak float64
	lastCommitted := ""
	var kept []string      // the checkpoints kept on disk, oldest first
	ownerRecords := 0      // the owner's records over every commit
	var lastScope []string // the capture keys the last commit wrote
	for n := 1; time.Since(begin) < c.duration; n++ {
		time.Sleep(time.Until(begin.Add(time.Duration(n) * c.every)))
		if time.Since(begin) >= c.duration {
			break
		}
		id := fmt.Sprintf("ckpt-%03d", n)
		dir := filepath.Join(ckptDir, id)
		d := currentDriver()
		t0 := time.Now()
		var prep prepareReply
		err := ctl.call(d.url, "prepare", map[string]any{"checkpoint_id": id, "deadline_ts": float64(time.Now().Add(60*time.Second).UnixNano()) / 1e9}, &prep)
		took := time.Since(t0)
		if err != nil {
			return err
		}
		prepares = append(prepares, took.Seconds())
		bd, berr := readBreakdown(driverLog(driverN), t0, t0.Add(took))
		if berr != nil {
			fmt.Fprintf(os.Stderr, "soak: %s: cannot read the driver's log for the breakdown: %v\n", id, berr)
		} else {
			breakdowns = append(breakdowns, bd)
			fmt.Fprintf(os.Stderr, "soak: %s: %s\n", id, bd)
		}
		if prep.Phase != "prepared" {
			notParked = append(notParked, prep.Report.Blockers...)
			if err := ctl.call(d.url, "resume", map[string]any{"checkpoint_id": id}, nil); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "soak: %s: %d runs not parked by the deadline; resumed without commit\n", id, prep.Report.BlockerCount)
			continue
		}
		// Gym's order: the agent, then the resources.
		var oprep prepareReply
		if err := ctl.call(owner.url, "prepare", map[string]any{"checkpoint_id": id}, &oprep); err != nil {
			return fmt.Errorf("owner %w", err)
		}
		if oprep.Phase != "prepared" {
			notParked = append(notParked, oprep.Report.Blockers...)
			if err := ctl.resumeAll(owner.url, d.url, id); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "soak: %s: the owner was not ready by the deadline (%d blockers); resumed without commit\n", id, oprep.Report.BlockerCount)
			continue
		}
		// Both commit into one folder, with the same scope (every episode).
		var com, ocom commitReply
		if err := ctl.call(d.url, "commit", map[string]any{"checkpoint_id": id, "checkpoint_dir": dir}, &com); err != nil {
			return err
		}
		if err := ctl.call(owner.url, "commit", map[string]any{"checkpoint_id": id, "checkpoint_dir": dir}, &ocom); err != nil {
			return fmt.Errorf("owner %w", err)
		}
		if com.Phase != "committed" || ocom.Phase != "committed" || ocom.Manifest.RecordCount != len(ocom.EpisodeIDs) {
			return fmt.Errorf("commit %s: the driver answered %+v, the owner %+v", id, com, ocom)
		}
		for _, k := range ocom.EpisodeIDs {
			if !slices.Contains(com.EpisodeIDs, k) {
				return fmt.Errorf("commit %s: the owner exported %s, of which the driver wrote no record", id, k)
			}
		}
		if err := ctl.resumeAll(owner.url, d.url, id); err != nil {
			return err
		}
		ownerRecords += ocom.Manifest.RecordCount
		lastCommitted, lastScope = id, com.EpisodeIDs
		if kept = append(kept, id); len(kept) > 3 {
			// Older checkpoints will not be restored: their folders go, and
			// with them (at the owner's next commit) their snapshots.
			if err := os.RemoveAll(filepath.Join(ckptDir, kept[0])); err != nil {
				return err
			}
			kept = kept[1:]
		}
		fmt.Fprintf(os.Stderr, "soak: %s at %5.1fs: prepare %.3fs, %d runs and %d owner sessions exported, %d restarts, %d finished\n",
			id, time.Since(begin).Seconds(), took.Seconds(), com.Manifest.RecordCount, ocom.Manifest.RecordCount, len(prep.Report.Restarts), finished.Load())
		if !crashed && time.Since(begin) >= c.crashAt {
			crashed = true
			time.Sleep(2 * time.Second)
			peak, cpu := usage(d.cmd.Process.Pid)
			driverPeak, driverCPU = max(driverPeak, peak), driverCPU+cpu
			fmt.Fprintf(os.Stderr, "soak: crash: SIGKILL the driver (pid %d) at %.1fs\n", d.cmd.Process.Pid, time.Since(begin).Seconds())
			d.kill()
			driverN = 2
			nd, err := startDriver(driverN)
			if err != nil {
				return err
			}
			driverMu.Lock()
			driver = nd
			driverMu.Unlock()
			// The controller continues the episodes the last commit wrote,
			// on both participants, from the same folder.
			scope := make([]episodeID, 0, len(lastScope))
			for _, k := range lastScope {
				scope = append(scope, parseKey(k))
			}
			restoreID := "restore-" + lastCommitted
			restoreBody := map[string]any{"checkpoint_id": restoreID, "checkpoint_dir": filepath.Join(ckptDir, lastCommitted), "episode_ids": scope}
			var r, or restoreReply
			if err := ctl.call(nd.url, "restore", restoreBody, &r); err != nil {
				return err
			}
			delete(restoreBody, "deadline_ts")
			if err := ctl.call(owner.url, "restore", restoreBody, &or); err != nil {
				return fmt.Errorf("owner %w", err)
			}
			if r.Phase != "restored" || or.Phase != "restored" || r.SourceCheckpointID != lastCommitted || or.SourceCheckpointID != lastCommitted {
				return fmt.Errorf("restore %s: the driver answered %+v, the owner %+v", restoreID, r, or)
			}
			if err := ctl.resumeAll(owner.url, nd.url, restoreID); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "soak: restored %d runs and %d owner sessions from %s\n", len(r.Restored), len(or.Restored), r.SourceCheckpointID)
			close(restored)
		}
	}
	if !crashed || c.crashAt == 0 {
		// No restore is coming: runs the driver failed post their next
		// attempt now.
		close(restored)
	}
	fmt.Fprintf(os.Stderr, "soak: the owner exported %d sessions over the commits\n", ownerRecords)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	d := currentDriver()
	var metrics []byte
	select {
	case <-done:
	case <-time.After(c.duration + 10*time.Minute):
		fmt.Fprintln(os.Stderr, "soak: runs still in flight at the deadline")
	}
	if resp, err := http.Get(d.url + "/metrics"); err == nil {
		metrics, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	peak, cpu := usage(d.cmd.Process.Pid)
	driverPeak, driverCPU = max(driverPeak, peak), driverCPU+cpu
	wall := time.Since(begin)
	report(c, results, prepares, breakdowns, notParked, metrics, driverPeak, driverCPU, wall, base)
	return nil
}

// stopLaunches stops every launch left in the owner's sandboxes (by the
// launches' own records and tags, through ngsup).
func stopLaunches(bin, base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, "sandboxes", "*", ".ngharness", "launches", "*"))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, d := range dirs {
		wg.Add(1)
		sem <- struct{}{}
		go func(d string) {
			defer wg.Done()
			defer func() { <-sem }()
			exec.Command(filepath.Join(bin, "ngsup"), "stop", "--dir", d, "--id", filepath.Base(d), "--grace", "0s").Run()
		}(d)
	}
	wg.Wait()
}

func metric(metrics []byte, name string) map[string]float64 {
	out := map[string]float64{}
	for _, l := range strings.Split(string(metrics), "\n") {
		if !strings.HasPrefix(l, name) {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

func report(c config, results []result, prepares []float64, breakdowns []breakdown, notParked []string, metrics []byte, peakMB, cpuS float64, wall time.Duration, base string) {
	lost, pauses, relaunched, resumed, failedRuns := 0, 0, 0, 0, 0
	var errs, failures []string
	for i, r := range results {
		if len(r.failed) > 0 {
			failedRuns++
			if len(failures) < 5 {
				failures = append(failures, fmt.Sprintf("soak-%04d: %s", i, r.failed[0]))
			}
		}
		if !r.ok {
			lost++
			if len(errs) < 5 {
				errs = append(errs, fmt.Sprintf("soak-%04d: %s", i, r.err))
			}
		}
		for j, l := range r.launches {
			pauses += l.Pauses
			if j > 0 {
				relaunched++
				if l.Resumed {
					resumed++
				}
			}
		}
	}
	// Steps done twice: each session's steps file must hold every step
	// number once.
	repeated := 0
	files, _ := filepath.Glob(filepath.Join(base, "sandboxes", "*", ".ngharness", "state", "fake", "*", fake.StepsFile))
	bySandboxRollout := map[string]bool{}
	for _, f := range files {
		steps, err := fake.ReadSteps(filepath.Dir(f))
		if err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, l := range steps {
			if seen[l] {
				repeated++
				break
			}
			seen[l] = true
		}
		bySandboxRollout[f] = true
	}
	slices.Sort(prepares)
	med, mx := 0.0, 0.0
	if n := len(prepares); n > 0 {
		med = prepares[n/2]
		if n%2 == 0 {
			med = (prepares[n/2-1] + prepares[n/2]) / 2
		}
		mx = prepares[n-1]
	}
	failed := metric(metrics, "ngdriver_failed_pauses_total")
	crash := "crash and restore at " + c.crashAt.String()
	if c.crashAt == 0 {
		crash = "no crash"
	}
	fmt.Printf("\n## Soak: %d rollouts, a checkpoint every %s for %s, %s (isolation %s)\n\n", c.rollouts, c.every, c.duration, crash, c.isolation)
	fmt.Printf("| figure | value |\n|---|---|\n")
	fmt.Printf("| checkpoints | %d |\n", len(prepares))
	fmt.Printf("| prepare, median | %.3f s |\n", med)
	fmt.Printf("| prepare, max | %.3f s |\n", mx)
	printBreakdowns(breakdowns)
	fmt.Printf("| runs not parked by a deadline | %d |\n", len(notParked))
	fmt.Printf("| pauses (counted in the results) | %d |\n", pauses)
	if len(failed) == 0 {
		fmt.Printf("| failed pauses (second driver's metrics) | 0 |\n")
	}
	for k, v := range failed {
		fmt.Printf("| failed pauses %s | %.0f |\n", k, v)
	}
	fmt.Printf("| relaunches (resumed the saved session) | %d (%d) |\n", relaunched, resumed)
	fmt.Printf("| runs lost | %d |\n", lost)
	fmt.Printf("| runs the driver failed (started over on the next attempt) | %d |\n", failedRuns)
	fmt.Printf("| runs that repeated a finished step | %d (of %d sessions checked) |\n", repeated, len(bySandboxRollout))
	fmt.Printf("| driver peak memory (VmHWM, max of both drivers) | %.0f MB |\n", peakMB)
	fmt.Printf("| driver CPU (both drivers) | %.1f s over %.0f s wall (%.0f%% of one core) |\n", cpuS, wall.Seconds(), 100*cpuS/wall.Seconds())
	for _, e := range errs {
		fmt.Printf("\nlost: %s\n", e)
	}
	for _, e := range failures {
		fmt.Printf("\nfailed: %s\n", e)
	}
}
